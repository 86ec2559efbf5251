// The oml_reconciler role (sql/0023_reconciler.sql), connected as it: a key-less auditor that
// reads every tenant's journal, outbox, frontier, dead letters and claim/attachment metadata, and
// holds no privilege on a table that holds a wrapped key or plaintext-derived text. Each privilege
// is asserted exactly: the full list of what it holds in schema oml, and each refusal with 42501.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "db/conn.h"
#include "db/migrate.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::db {
namespace {

// Every table the reconciler reads directly (each under RLS, with a policy <table>_reconciler_read).
const std::set<std::string> kReadable = {
    "tenants",       "chain_heads",     "journal",     "signing_keys",  "outbox",        "lake_frontier",
    "lake_table_txn", "dead_letter",    "artifacts",   "artifact_bodies", "attachments", "simulations",
    "review_served", "review_progress"};

class ReconcilerRoleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tj_ = new journal::testing::TestJournal(4);
    tenant_a_ = std::move(journal::CreateTenant(tj_->journal, "rc-a")).value().tenant_id;
    tenant_b_ = std::move(journal::CreateTenant(tj_->journal, "rc-b")).value().tenant_id;
  }
  void SetUp() override {
    rc_ = std::make_unique<Conn>(std::move(Conn::Connect(testing::ReconcilerUrl())).value());
    su_ = std::make_unique<Conn>(std::move(Conn::Connect(testing::SuperuserUrl())).value());
  }

  // The statement fails with SQLSTATE `sqlstate` (42501: missing privilege).
  static void ExpectSqlState(const Result<Rows>& r, const std::string& sqlstate, const std::string& what) {
    ASSERT_FALSE(r.ok()) << what << " succeeded";
    EXPECT_NE(r.status().log_detail().find("[" + sqlstate + "]"), std::string::npos)
        << what << ": " << r.status().log_detail();
  }
  static void ExpectDenied(const Result<Rows>& r, const std::string& what) {
    ExpectSqlState(r, "42501", what);
    if (!r.ok()) {
      EXPECT_EQ(r.status().type(), "database-permission-denied") << what << ": " << r.status().ToString();
    }
  }
  std::set<std::string> Column(const std::string& sql) {
    auto r = su_->Query(sql);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::set<std::string> out;
    for (int i = 0; r.ok() && i < r->size(); ++i) out.insert(r->Get(i, 0));
    return out;
  }
  // A receiving upload session with key material, inserted as the superuser.
  void InsertUploadSession(const std::string& tenant, const std::string& upload_id) {
    auto r = su_->Query(
        "INSERT INTO oml.upload_sessions (tenant_id, upload_id, api_key_id, principal, state, upload_length, "
        "declared_sha256, filename, media_type, upload_offset, kek_id, wrapped_dek, segment_size, nonce_prefix, "
        "stream_sealed, plaintext_sha_sealed, ciphertext_sha_state, ciphertext_offset, part_count, parts_left, "
        "expires_at) VALUES ($1, $2, 'ak_0123456789abcdef', 'alice', 'receiving', 100, "
        "decode(repeat('11', 32), 'hex'), 'secret-name.pdf', 'application/pdf', 40, 'file:0123456789abcdef', "
        "'\\xdeadbeef', 65536, decode(repeat('22', 7), 'hex'), '\\x01', '\\x02', decode(repeat('33', 112), 'hex'), "
        "57, 1, true, now() + interval '1 day')",
        {Text(tenant), Text(upload_id)});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  static journal::testing::TestJournal* tj_;
  static std::string tenant_a_, tenant_b_;
  std::unique_ptr<Conn> rc_, su_;
};
journal::testing::TestJournal* ReconcilerRoleTest::tj_ = nullptr;
std::string ReconcilerRoleTest::tenant_a_, ReconcilerRoleTest::tenant_b_;

TEST_F(ReconcilerRoleTest, IsALoginRoleWithoutSuperuserOrBypassRls) {
  auto r = rc_->Query("SELECT current_user, r.rolsuper, r.rolbypassrls, r.rolcreaterole, r.rolcreatedb, r.rolcanlogin "
                      "FROM pg_roles r WHERE r.rolname = current_user");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1);
  EXPECT_EQ(r->Get(0, 0), "oml_reconciler");
  EXPECT_EQ(r->Get(0, 1), "f");
  EXPECT_EQ(r->Get(0, 2), "f");
  EXPECT_EQ(r->Get(0, 3), "f");
  EXPECT_EQ(r->Get(0, 4), "f");
  EXPECT_EQ(r->Get(0, 5), "t");
  // Member of pg_read_all_stats only (statistics, no table data), not of oml_owner.
  EXPECT_EQ(Column("SELECT b.rolname FROM pg_auth_members m JOIN pg_roles u ON u.oid = m.member "
                   "JOIN pg_roles b ON b.oid = m.roleid WHERE u.rolname = 'oml_reconciler'"),
            (std::set<std::string>{"pg_read_all_stats"}));
  // May connect; may create nothing in the database, not even temporary objects.
  EXPECT_EQ(Column("SELECT has_database_privilege('oml_reconciler', current_database(), 'CONNECT')::text || "
                   "has_database_privilege('oml_reconciler', current_database(), 'CREATE')::text || "
                   "has_database_privilege('oml_reconciler', current_database(), 'TEMPORARY')::text"),
            (std::set<std::string>{"truefalsefalse"}));
  ExpectDenied(rc_->Query("CREATE TEMP TABLE t (x int)"), "CREATE TEMP TABLE");
}

TEST_F(ReconcilerRoleTest, HoldsExactlyTheseGrantsInSchemaOml) {
  std::set<std::string> want;
  for (const auto& t : kReadable) want.insert(t + ":SELECT");
  want.insert("schema_migrations:SELECT");
  want.insert("upload_sessions_audit:SELECT");
  // Its one write (sql/0024): a row per run.
  want.insert("reconcile_runs:SELECT");
  want.insert("reconcile_runs:INSERT");
  EXPECT_EQ(Column("SELECT c.relname || ':' || p FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) p "
                   "WHERE n.nspname = 'oml' AND c.relkind IN ('r', 'p', 'v', 'm', 'f') "
                   "AND has_table_privilege('oml_reconciler', c.oid, p)"),
            want);
  EXPECT_EQ(Column("SELECT c.relname || ':' || p FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "CROSS JOIN unnest(ARRAY['SELECT','USAGE','UPDATE']) p "
                   "WHERE n.nspname = 'oml' AND c.relkind = 'S' AND has_sequence_privilege('oml_reconciler', c.oid, p)"),
            (std::set<std::string>{"outbox_seq:SELECT"}));
  // No column-level privilege on top of those (a column grant would open a key table partly).
  EXPECT_EQ(Column("SELECT c.relname || '.' || a.attname || ':' || p FROM pg_class c "
                   "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_attribute a ON a.attrelid = c.oid "
                   "CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','REFERENCES']) p "
                   "WHERE n.nspname = 'oml' AND a.attnum > 0 AND NOT a.attisdropped "
                   "AND has_column_privilege('oml_reconciler', c.oid, a.attnum, p) "
                   "AND NOT has_table_privilege('oml_reconciler', c.oid, p)"),
            (std::set<std::string>{}));
  // Functions: the two the per-tenant policies call (tenants_scope calls provider_tenant()).
  EXPECT_EQ(Column("SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                   "WHERE n.nspname = 'oml' AND has_function_privilege('oml_reconciler', p.oid, 'EXECUTE')"),
            (std::set<std::string>{"current_tenant", "provider_tenant"}));
  // Each table it reads has RLS on and exactly one policy of its own, SELECT-only, `true`.
  std::set<std::string> policies;
  for (const auto& t : kReadable) policies.insert(t + ":" + t + "_reconciler_read:r:true:true:{oml_reconciler}:true");
  EXPECT_EQ(Column("SELECT c.relname || ':' || p.polname || ':' || p.polcmd::text || ':' || p.polpermissive::text || ':' "
                   "|| pg_get_expr(p.polqual, p.polrelid) || ':' || p.polroles::regrole[]::text || ':' "
                   "|| c.relrowsecurity::text FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid "
                   "WHERE 'oml_reconciler'::regrole::oid = ANY(p.polroles)"),
            policies);
}

// (a) No grant on any table holding a wrapped key or plaintext-derived text.
TEST_F(ReconcilerRoleTest, CannotReadKeysSearchTextCredentialsOrUploadSessions) {
  for (const char* t : {"artifact_keys", "attachment_keys", "upload_sessions", "api_keys", "idempotency_keys",
                        "idempotency_fence", "claim_text"}) {
    ExpectDenied(rc_->Query(std::string("SELECT 1 FROM oml.") + t + " LIMIT 1"), std::string("SELECT ") + t);
    EXPECT_EQ(Column(std::string("SELECT has_any_column_privilege('oml_reconciler', 'oml.") + t + "', 'SELECT')"),
              (std::set<std::string>{"f"}))
        << t;
  }
  // Generically: every relation of the schema with a wrapped_dek column. The list is not empty
  // (the check would pass vacuously otherwise) and holds the three key tables known today.
  const std::set<std::string> with_keys =
      Column("SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
             "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'oml' AND a.attname = 'wrapped_dek' "
             "AND a.attnum > 0 AND NOT a.attisdropped");
  ASSERT_FALSE(with_keys.empty());
  for (const char* t : {"artifact_keys", "attachment_keys", "upload_sessions"}) EXPECT_EQ(with_keys.count(t), 1u) << t;
  for (const auto& t : with_keys) {
    EXPECT_EQ(Column("SELECT has_table_privilege('oml_reconciler', 'oml." + t + "', 'SELECT')::text || "
                     "has_any_column_privilege('oml_reconciler', 'oml." + t + "', 'SELECT')::text"),
              (std::set<std::string>{"falsefalse"}))
        << t;
  }
  // Likewise every relation holding a search vector (text derived from a plaintext).
  const std::set<std::string> with_text =
      Column("SELECT c.relname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
             "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'oml' "
             "AND a.atttypid = 'tsvector'::regtype AND a.attnum > 0 AND NOT a.attisdropped");
  EXPECT_EQ(with_text, (std::set<std::string>{"claim_text"}));
  for (const auto& t : with_text) {
    EXPECT_EQ(Column("SELECT has_any_column_privilege('oml_reconciler', 'oml." + t + "', 'SELECT')"),
              (std::set<std::string>{"f"}))
        << t;
  }
}

// (b) It writes nothing but its run record (oml.reconcile_runs, INSERT only).
TEST_F(ReconcilerRoleTest, CannotWriteJournalOutboxFrontierOrClaims) {
  ExpectDenied(rc_->Query("INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, "
                          "signed_bytes, signature) VALUES ($1, 999, '\\x00', '\\x00', 'x', 'k', '', '')",
                          {Text(tenant_a_)}),
               "INSERT journal");
  ExpectDenied(rc_->Query("UPDATE oml.journal SET event_type = 'x' WHERE tenant_id = $1", {Text(tenant_a_)}),
               "UPDATE journal");
  ExpectDenied(rc_->Query("DELETE FROM oml.journal WHERE tenant_id = $1", {Text(tenant_a_)}), "DELETE journal");
  ExpectDenied(rc_->Query("UPDATE oml.reconcile_runs SET findings = 0"), "UPDATE reconcile_runs");
  ExpectDenied(rc_->Query("DELETE FROM oml.reconcile_runs"), "DELETE reconcile_runs");
  ExpectDenied(rc_->Query("INSERT INTO oml.outbox (seq, tenant_id, xid, target_table, journal_seq, row_data) "
                          "VALUES (999999, $1, pg_current_xact_id(), 'bronze/events', 1, '{}')",
                          {Text(tenant_a_)}),
               "INSERT outbox");
  ExpectDenied(rc_->Query("UPDATE oml.outbox SET row_data = '{}' WHERE tenant_id = $1", {Text(tenant_a_)}),
               "UPDATE outbox");
  ExpectDenied(rc_->Query("DELETE FROM oml.outbox WHERE seq <= 1"), "DELETE outbox");
  ExpectDenied(rc_->Query("TRUNCATE oml.outbox"), "TRUNCATE outbox");
  ExpectDenied(rc_->Query("SELECT nextval('oml.outbox_seq')"), "nextval");
  ExpectDenied(rc_->Query("INSERT INTO oml.lake_frontier (stream) VALUES ('shard-9')"), "INSERT lake_frontier");
  ExpectDenied(rc_->Query("UPDATE oml.lake_frontier SET frontier_seq = frontier_seq + 1 WHERE stream = 'default'"),
               "UPDATE lake_frontier");
  ExpectDenied(rc_->Query("DELETE FROM oml.lake_frontier"), "DELETE lake_frontier");
  ExpectDenied(rc_->Query("INSERT INTO oml.artifacts (tenant_id, artifact_id, version, workarea_id, path, principal, "
                          "writer_key_id, provenance, media_type, size_bytes, plaintext_sha256, ciphertext_sha256, "
                          "state, submitted_seq) VALUES ($1, gen_random_uuid(), 1, 'w', 'p', 'x', 'k', 'human', "
                          "'text/plain', 1, decode(repeat('00', 32), 'hex'), decode(repeat('00', 32), 'hex'), "
                          "'held', 1)",
                          {Text(tenant_a_)}),
               "INSERT artifacts");
  ExpectDenied(rc_->Query("UPDATE oml.artifacts SET state = 'erased' WHERE tenant_id = $1", {Text(tenant_a_)}),
               "UPDATE artifacts");
  ExpectDenied(rc_->Query("DELETE FROM oml.artifacts WHERE tenant_id = $1", {Text(tenant_a_)}), "DELETE artifacts");
  // The view is auto-updatable: only its missing grants stop a write through it.
  ExpectDenied(rc_->Query("UPDATE oml.upload_sessions_audit SET state = 'failed'"), "UPDATE upload_sessions_audit");
  ExpectDenied(rc_->Query("DELETE FROM oml.upload_sessions_audit"), "DELETE upload_sessions_audit");
  // Nothing of the above changed a row.
  auto rows = su_->Query("SELECT (SELECT count(*) FROM oml.outbox WHERE seq = 999999), "
                         "(SELECT count(*) FROM oml.journal WHERE seq = 999), "
                         "(SELECT count(*) FROM oml.lake_frontier WHERE stream = 'shard-9')");
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(rows->GetInt(0, 0), 0);
  EXPECT_EQ(rows->GetInt(0, 1), 0);
  EXPECT_EQ(rows->GetInt(0, 2), 0);
}

// (c) Every tenant's rows, with no tenant scope set.
TEST_F(ReconcilerRoleTest, ReadsEveryTenantsJournalAndOutboxWithoutAScope) {
  for (const auto& t : {tenant_a_, tenant_b_}) {
    for (const char* table : {"journal", "outbox", "chain_heads"}) {
      const std::string count = std::string("SELECT count(*) FROM oml.") + table + " WHERE tenant_id = $1";
      auto want = su_->Query(count, {Text(t)});
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      ASSERT_GE(want->GetInt(0, 0), 1) << table;  // the tenant's genesis
      auto got = rc_->Query(count, {Text(t)});
      ASSERT_TRUE(got.ok()) << table << ": " << got.status().ToString();
      EXPECT_EQ(got->GetInt(0, 0), want->GetInt(0, 0)) << table << " " << t;
    }
    // The chain's signed bytes, byte for byte.
    const std::string bytes =
        "SELECT string_agg(encode(sha256(signed_bytes || signature), 'hex'), ',' ORDER BY seq) FROM oml.journal "
        "WHERE tenant_id = $1";
    auto want = su_->Query(bytes, {Text(t)});
    auto got = rc_->Query(bytes, {Text(t)});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->Get(0, 0), want->Get(0, 0));
  }
  for (const char* table : {"journal", "outbox", "tenants", "chain_heads", "signing_keys", "lake_frontier"}) {
    const std::string all = std::string("SELECT count(*) FROM oml.") + table;
    auto want = su_->Query(all);
    auto got = rc_->Query(all);
    ASSERT_TRUE(got.ok()) << table << ": " << got.status().ToString();
    EXPECT_EQ(got->GetInt(0, 0), want->GetInt(0, 0)) << table;
  }
  auto names = rc_->Query("SELECT string_agg(name, ',' ORDER BY name) FROM oml.tenants WHERE tenant_id IN ($1, $2)",
                          {Text(tenant_a_), Text(tenant_b_)});
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(names->Get(0, 0), "rc-a,rc-b");
  // The last value of the outbox sequence, without drawing one.
  auto last = rc_->Query("SELECT pg_sequence_last_value('oml.outbox_seq') = (SELECT max(seq) FROM oml.outbox)");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->Get(0, 0), "t");
  // Every other table it reads answers too, under its policy (no 42501 from a policy's function).
  for (const auto& t : kReadable) {
    auto r = rc_->Query("SELECT count(*) FROM oml." + t);
    EXPECT_TRUE(r.ok()) << t << ": " << r.status().ToString();
  }
  // The application role still sees only its scope: no scope, no rows.
  auto app = Conn::Connect(testing::AppUrl());
  ASSERT_TRUE(app.ok());
  auto unscoped = app->Query("SELECT (SELECT count(*) FROM oml.journal) + (SELECT count(*) FROM oml.outbox)");
  ASSERT_TRUE(unscoped.ok());
  EXPECT_EQ(unscoped->GetInt(0, 0), 0);
}

TEST_F(ReconcilerRoleTest, ReadsUploadSessionsThroughTheAuditViewWithoutKeyMaterial) {
  const std::string up_a = "6f6d6c00-0000-4000-8000-00000000000a", up_b = "6f6d6c00-0000-4000-8000-00000000000b";
  InsertUploadSession(tenant_a_, up_a);
  InsertUploadSession(tenant_b_, up_b);
  // Both tenants' sessions, no scope set.
  auto rows = rc_->Query("SELECT tenant_id::text, upload_id::text, state, upload_length, upload_offset, "
                         "ciphertext_offset, part_count, parts_left FROM oml.upload_sessions_audit "
                         "WHERE upload_id IN ($1, $2) ORDER BY upload_id",
                         {Text(up_a), Text(up_b)});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 2);
  EXPECT_EQ(rows->Get(0, 0), tenant_a_);
  EXPECT_EQ(rows->Get(0, 1), up_a);
  EXPECT_EQ(rows->Get(1, 0), tenant_b_);
  EXPECT_EQ(rows->Get(1, 1), up_b);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(rows->Get(i, 2), "receiving");
    EXPECT_EQ(rows->GetInt(i, 3), 100);
    EXPECT_EQ(rows->GetInt(i, 4), 40);
    EXPECT_EQ(rows->GetInt(i, 5), 57);
    EXPECT_EQ(rows->GetInt(i, 6), 1);
    EXPECT_EQ(rows->Get(i, 7), "t");
  }
  // Exactly these columns: nothing that holds a key, a sealed state or the client's words.
  auto cols = su_->Query("SELECT string_agg(a.attname, ',' ORDER BY a.attnum) FROM pg_attribute a "
                         "WHERE a.attrelid = 'oml.upload_sessions_audit'::regclass AND a.attnum > 0");
  ASSERT_TRUE(cols.ok());
  EXPECT_EQ(cols->Get(0, 0),
            "tenant_id,upload_id,state,upload_length,upload_offset,ciphertext_offset,part_count,parts_left,"
            "created_at,updated_at,expires_at,completed_at,ciphertext_sha256,ciphertext_size,object_key,direct,store_upload");
  ExpectSqlState(rc_->Query("SELECT wrapped_dek FROM oml.upload_sessions_audit"), "42703", "SELECT wrapped_dek");
  // The view sees every tenant because its owner is the table's owner and RLS is not FORCEd.
  auto owner = su_->Query("SELECT v.relowner::regrole::text, t.relowner::regrole::text, t.relrowsecurity, "
                          "t.relforcerowsecurity, coalesce(array_to_string(v.reloptions, ','), '') FROM pg_class v, "
                          "pg_class t WHERE v.oid = 'oml.upload_sessions_audit'::regclass "
                          "AND t.oid = 'oml.upload_sessions'::regclass");
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(owner->Get(0, 0), "oml_owner");
  EXPECT_EQ(owner->Get(0, 1), "oml_owner");
  EXPECT_EQ(owner->Get(0, 2), "t");
  EXPECT_EQ(owner->Get(0, 3), "f");
  EXPECT_EQ(owner->Get(0, 4), "");  // no security_invoker
  // The table itself stays closed, and the view is the reconciler's alone.
  ExpectDenied(rc_->Query("SELECT 1 FROM oml.upload_sessions LIMIT 1"), "SELECT upload_sessions");
  EXPECT_EQ(Column("SELECT r FROM unnest(ARRAY['oml_app', 'oml_lakewriter', 'oml_reconciler']) r "
                   "WHERE has_table_privilege(r, 'oml.upload_sessions_audit', 'SELECT')"),
            (std::set<std::string>{"oml_reconciler"}));
  auto su_del = su_->Query("DELETE FROM oml.upload_sessions WHERE upload_id IN ($1, $2)", {Text(up_a), Text(up_b)});
  ASSERT_TRUE(su_del.ok()) << su_del.status().ToString();
  EXPECT_EQ(su_del->Affected(), 2);
}

// `oml migrate` on a database already at the latest version: no migration runs again, the role
// is brought back to NOBYPASSRLS NOSUPERUSER, and its password is set from MigrateOptions.
TEST_F(ReconcilerRoleTest, MigrateAgainRestoresTheRoleAndSetsItsPassword) {
  ASSERT_TRUE(su_->Exec("ALTER ROLE oml_reconciler BYPASSRLS").ok());
  MigrateOptions opts;
  opts.reconciler_password = "reconciler-secret";
  auto applied = Migrate(*su_, opts);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(*applied, std::vector<int>{});
  auto r = su_->Query("SELECT rolbypassrls, rolsuper, left(rolpassword, 14) FROM pg_authid "
                      "WHERE rolname = 'oml_reconciler'");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1);
  EXPECT_EQ(r->Get(0, 0), "f");
  EXPECT_EQ(r->Get(0, 1), "f");
  EXPECT_EQ(r->Get(0, 2), "SCRAM-SHA-256$");  // the verifier, never the cleartext
  // The other roles' passwords are left alone (empty options leave them unset).
  EXPECT_EQ(Column("SELECT rolname FROM pg_authid WHERE rolname IN ('oml_app', 'oml_lakewriter') "
                   "AND rolpassword IS NOT NULL"),
            (std::set<std::string>{}));
  EXPECT_EQ(Column("SELECT count(*)::text FROM pg_policy WHERE 'oml_reconciler'::regrole::oid = ANY(polroles)"),
            (std::set<std::string>{std::to_string(kReadable.size())}));
  ASSERT_TRUE(su_->Exec("ALTER ROLE oml_reconciler PASSWORD NULL").ok());
}

}  // namespace
}  // namespace oml::db
