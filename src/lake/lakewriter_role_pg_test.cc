// The oml_lakewriter role (sql/0008_lakewriter.sql), connected as it: it reads every tenant's
// outbox rows, owns the frontier and the dead letters, and nothing else. Each privilege is
// asserted exactly: the full list of what it holds in schema oml, and each refusal with 42501.
#include <gtest/gtest.h>

#include <set>

#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"
#include "lake/outbox_cut.h"

namespace oml::lake {
namespace {

class LakewriterRoleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tj_ = new journal::testing::TestJournal(4);
    tenant_a_ = std::move(journal::CreateTenant(tj_->journal, "lw-a")).value().tenant_id;
    tenant_b_ = std::move(journal::CreateTenant(tj_->journal, "lw-b")).value().tenant_id;
  }
  void SetUp() override {
    lw_ = std::make_unique<db::Conn>(std::move(db::Conn::Connect(db::testing::LakewriterUrl())).value());
    su_ = std::make_unique<db::Conn>(std::move(db::Conn::Connect(db::testing::SuperuserUrl())).value());
  }

  // The statement fails with SQLSTATE 42501 (missing privilege, RLS, or a guard trigger).
  static void ExpectDenied(const Result<db::Rows>& r, const std::string& what, const std::string& message = "") {
    ASSERT_FALSE(r.ok()) << what << " succeeded";
    EXPECT_EQ(r.status().type(), "database-permission-denied") << what << ": " << r.status().ToString();
    EXPECT_NE(r.status().log_detail().find("[42501]"), std::string::npos) << what << ": " << r.status().log_detail();
    if (!message.empty()) {
      EXPECT_NE(r.status().log_detail().find(message), std::string::npos) << what << ": " << r.status().log_detail();
    }
  }
  std::set<std::string> Column(const std::string& sql) {
    auto r = su_->Query(sql);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::set<std::string> out;
    for (int i = 0; r.ok() && i < r->size(); ++i) out.insert(r->Get(i, 0));
    return out;
  }

  static journal::testing::TestJournal* tj_;
  static std::string tenant_a_, tenant_b_;
  std::unique_ptr<db::Conn> lw_, su_;
};
journal::testing::TestJournal* LakewriterRoleTest::tj_ = nullptr;
std::string LakewriterRoleTest::tenant_a_, LakewriterRoleTest::tenant_b_;

TEST_F(LakewriterRoleTest, IsALoginRoleWithoutSuperuserOrBypassRls) {
  auto r = lw_->Query("SELECT current_user, r.rolsuper, r.rolbypassrls, r.rolcreaterole, r.rolcreatedb, r.rolcanlogin "
                      "FROM pg_roles r WHERE r.rolname = current_user");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Get(0, 0), "oml_lakewriter");
  EXPECT_EQ(r->Get(0, 1), "f");
  EXPECT_EQ(r->Get(0, 2), "f");
  EXPECT_EQ(r->Get(0, 3), "f");
  EXPECT_EQ(r->Get(0, 4), "f");
  EXPECT_EQ(r->Get(0, 5), "t");
  // Member of pg_read_all_stats only (lake/outbox_cut.h, HorizonHolders), not of oml_owner.
  EXPECT_EQ(Column("SELECT b.rolname FROM pg_auth_members m JOIN pg_roles u ON u.oid = m.member "
                   "JOIN pg_roles b ON b.oid = m.roleid WHERE u.rolname = 'oml_lakewriter'"),
            (std::set<std::string>{"pg_read_all_stats"}));
}

TEST_F(LakewriterRoleTest, HoldsExactlyTheseGrantsInSchemaOml) {
  // Every table-level privilege on every table and sequence of the schema.
  EXPECT_EQ(Column("SELECT c.relname || ':' || p FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) p "
                   "WHERE n.nspname = 'oml' AND c.relkind IN ('r', 'p', 'v', 'm') "
                   "AND has_table_privilege('oml_lakewriter', c.oid, p)"),
            (std::set<std::string>{"outbox:SELECT", "lake_frontier:SELECT", "dead_letter:SELECT",
                                   "schema_migrations:SELECT", "lake_table_txn:SELECT", "lake_table_txn:INSERT",
                                   "outbox_prune:SELECT", "outbox_prune_tenant:SELECT"}));
  EXPECT_EQ(Column("SELECT c.relname || ':' || p FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "CROSS JOIN unnest(ARRAY['SELECT','USAGE','UPDATE']) p "
                   "WHERE n.nspname = 'oml' AND c.relkind = 'S' AND has_sequence_privilege('oml_lakewriter', c.oid, p)"),
            (std::set<std::string>{"outbox_seq:SELECT"}));
  // Column-level privileges on top.
  EXPECT_EQ(Column("SELECT c.relname || '.' || a.attname || ':' || p FROM pg_class c "
                   "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
                   "CROSS JOIN unnest(ARRAY['INSERT','UPDATE','REFERENCES']) p "
                   "WHERE n.nspname = 'oml' AND a.attnum > 0 AND NOT a.attisdropped "
                   "AND has_column_privilege('oml_lakewriter', c.oid, a.attnum, p) "
                   "AND NOT has_table_privilege('oml_lakewriter', c.oid, p)"),
            (std::set<std::string>{"lake_frontier.frontier_seq:UPDATE", "lake_frontier.lease_holder:UPDATE",
                                   "lake_frontier.lease_epoch:UPDATE", "lake_frontier.lease_expires_at:UPDATE",
                                   "lake_frontier.updated_at:UPDATE", "lake_table_txn.txn_version:UPDATE",
                                   "lake_table_txn.updated_at:UPDATE"}));
  // Functions: current_tenant(), which the outbox's per-tenant policy calls, the two steps of a
  // dead letter (sql/0010), which journal only materialize-skipped, and the outbox prune with the
  // feeds of pruned events (sql/0025), all under the lease.
  EXPECT_EQ(Column("SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                   "WHERE n.nspname = 'oml' AND has_function_privilege('oml_lakewriter', p.oid, 'EXECUTE')"),
            (std::set<std::string>{"current_tenant", "lake_dead_letter_begin", "lake_dead_letter_commit",
                                   "prune_outbox", "lake_journal_feed", "lake_body_locations"}));
}

TEST_F(LakewriterRoleTest, ReadsEveryTenantsOutboxRowsWithoutAScope) {
  const std::string count =
      "SELECT count(*) FROM oml.outbox WHERE tenant_id = $1";
  for (const auto& t : {tenant_a_, tenant_b_}) {
    auto want = su_->Query(count, {db::Text(t)});
    ASSERT_TRUE(want.ok());
    ASSERT_GE(want->GetInt(0, 0), 1);  // tenant genesis
    auto got = lw_->Query(count, {db::Text(t)});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->GetInt(0, 0), want->GetInt(0, 0)) << t;
  }
  auto all_su = su_->Query("SELECT count(*), max(seq) FROM oml.outbox");
  auto all_lw = lw_->Query("SELECT count(*), max(seq) FROM oml.outbox");
  ASSERT_TRUE(all_lw.ok());
  EXPECT_EQ(all_lw->Get(0, 0), all_su->Get(0, 0));
  // The last value of the sequence, without drawing one.
  auto last = lw_->Query("SELECT pg_sequence_last_value('oml.outbox_seq')");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->Get(0, 0), all_su->Get(0, 1));
  // The application role still sees only its scope: no scope, no rows.
  auto app = db::Conn::Connect(db::testing::AppUrl());
  ASSERT_TRUE(app.ok());
  auto unscoped = app->Query("SELECT count(*) FROM oml.outbox");
  ASSERT_TRUE(unscoped.ok());
  EXPECT_EQ(unscoped->GetInt(0, 0), 0);
}

TEST_F(LakewriterRoleTest, CannotReadKeysBodiesOrAnyOtherTable) {
  for (const char* t : {"artifact_keys", "artifact_bodies", "artifacts", "journal", "chain_heads", "api_keys",
                        "tenants", "signing_keys", "idempotency_keys", "idempotency_fence"}) {
    ExpectDenied(lw_->Query(std::string("SELECT * FROM oml.") + t + " LIMIT 1"), std::string("SELECT ") + t);
  }
}

TEST_F(LakewriterRoleTest, CannotWriteTheJournalOrTheOutbox) {
  ExpectDenied(lw_->Query("INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, "
                          "signed_bytes, signature) VALUES ($1, 999, '\\x00', '\\x00', 'materialize-skipped', 'k', '', '')",
                          {db::Text(tenant_a_)}),
               "INSERT journal");
  ExpectDenied(lw_->Query("UPDATE oml.journal SET event_type = 'x' WHERE tenant_id = $1", {db::Text(tenant_a_)}),
               "UPDATE journal");
  ExpectDenied(lw_->Query("DELETE FROM oml.journal WHERE tenant_id = $1", {db::Text(tenant_a_)}), "DELETE journal");
  ExpectDenied(lw_->Query("UPDATE oml.outbox SET row_data = '{}' WHERE tenant_id = $1", {db::Text(tenant_a_)}),
               "UPDATE outbox");
  ExpectDenied(lw_->Query("DELETE FROM oml.outbox WHERE seq <= 1"), "DELETE outbox");
  ExpectDenied(lw_->Query("TRUNCATE oml.outbox"), "TRUNCATE outbox");
  ExpectDenied(lw_->Query("INSERT INTO oml.outbox (seq, tenant_id, xid, target_table, journal_seq, row_data) "
                          "VALUES (999999, $1, pg_current_xact_id(), 'bronze/events', 1, '{}')",
                          {db::Text(tenant_a_)}),
               "INSERT outbox");
  ExpectDenied(lw_->Query("SELECT nextval('oml.outbox_seq')"), "nextval");
  ExpectDenied(lw_->Query("SELECT oml.enqueue_outbox($1, 'bronze/events', 1, '{}')", {db::Text(tenant_a_)}),
               "enqueue_outbox");
  ExpectDenied(lw_->Query("SELECT oml.enqueue_outbox_json($1, 'bronze/events', 1, '{}'::json)", {db::Text(tenant_a_)}),
               "enqueue_outbox_json");
  ExpectDenied(lw_->Query("SELECT * FROM oml.lock_head($1)", {db::Text(tenant_a_)}), "lock_head");
  // Nothing of the above changed a row.
  auto rows = su_->Query("SELECT count(*) FROM oml.outbox WHERE seq = 999999");
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->GetInt(0, 0), 0);
}

TEST_F(LakewriterRoleTest, OwnsTheFrontierWhichNeverMovesBack) {
  auto before = lw_->Query("SELECT frontier_seq, lease_epoch FROM oml.lake_frontier WHERE stream = 'default'");
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_EQ(before->size(), 1);
  const int64_t f = before->GetInt(0, 0);
  auto up = lw_->Query("UPDATE oml.lake_frontier SET frontier_seq = $1, lease_holder = 'test:1', lease_epoch = lease_epoch + 1, "
                       "lease_expires_at = now() + interval '10 s', updated_at = now() WHERE stream = 'default'",
                       {db::Int(f + 5)});
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_EQ(up->Affected(), 1);
  auto stream = ResolveStream(kDefaultStream);
  EXPECT_EQ(*ReadFrontier(*lw_, *stream), f + 5);
  ExpectDenied(lw_->Query("UPDATE oml.lake_frontier SET frontier_seq = $1 WHERE stream = 'default'", {db::Int(f)}),
               "frontier back", "may not move back");
  ExpectDenied(lw_->Query("UPDATE oml.lake_frontier SET lease_epoch = 0 WHERE stream = 'default'"), "epoch back",
               "may not decrease");
  ExpectDenied(lw_->Query("UPDATE oml.lake_frontier SET stream = 'other' WHERE stream = 'default'"), "rename stream");
  ExpectDenied(lw_->Query("INSERT INTO oml.lake_frontier (stream) VALUES ('shard-1')"), "INSERT frontier");
  ExpectDenied(lw_->Query("DELETE FROM oml.lake_frontier"), "DELETE frontier");
  EXPECT_EQ(*ReadFrontier(*lw_, *stream), f + 5);
  // The application role has no business with it.
  auto app = db::Conn::Connect(db::testing::AppUrl());
  ASSERT_TRUE(app.ok());
  ExpectDenied(app->Query("SELECT * FROM oml.lake_frontier"), "app SELECT frontier");
  ExpectDenied(app->Query("SELECT * FROM oml.dead_letter"), "app SELECT dead_letter");
}

// Dead letters are written only by oml.lake_dead_letter_commit (with their signed event) and
// marked requeued only by the fold of materialize-requeued: the role has no direct write.
TEST_F(LakewriterRoleTest, WritesNoDeadLetterRowDirectly) {
  auto su_ins = su_->Query("INSERT INTO oml.dead_letter (stream, outbox_seq, tenant_id, target_table, journal_seq, "
                           "payload_ref, error, attempts) VALUES ('default', 424242, $1, 'bronze/events', 1, "
                           "'{\"digest\":\"ab\"}', 'poison', 5) RETURNING id",
                           {db::Text(tenant_a_)});
  ASSERT_TRUE(su_ins.ok()) << su_ins.status().ToString();
  const int64_t id = su_ins->GetInt(0, 0);
  ExpectDenied(lw_->Query("INSERT INTO oml.dead_letter (stream, outbox_seq, tenant_id, target_table, journal_seq, "
                          "payload_ref, error, attempts) VALUES ('default', 424243, $1, 'bronze/events', 1, '{}', "
                          "'poison', 5)",
                          {db::Text(tenant_b_)}),
               "INSERT dead_letter");
  ExpectDenied(lw_->Query("UPDATE oml.dead_letter SET requeued_at = now() WHERE id = $1", {db::Int(id)}), "requeue");
  ExpectDenied(lw_->Query("UPDATE oml.dead_letter SET error = 'edited' WHERE id = $1", {db::Int(id)}), "edit");
  ExpectDenied(lw_->Query("DELETE FROM oml.dead_letter WHERE id = $1", {db::Int(id)}), "DELETE dead_letter");
  ExpectDenied(lw_->Query("SELECT oml.requeue_dead_letter($1, 1)", {db::Int(id)}), "requeue_dead_letter");
  auto rows = lw_->Query("SELECT tenant_id::text, error, requeued_at IS NULL FROM oml.dead_letter WHERE id = $1",
                         {db::Int(id)});
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1);
  EXPECT_EQ(rows->Get(0, 0), tenant_a_);
  EXPECT_EQ(rows->Get(0, 1), "poison");
  EXPECT_EQ(rows->Get(0, 2), "t");
}

}  // namespace
}  // namespace oml::lake
