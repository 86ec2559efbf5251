// Fold verification (folds.h) against a real PostgreSQL cluster (db/test_cluster.h): events are
// written through the real code paths (provider.cc, admission/claims.cc, admission/attachments.cc
// for review.served and the review gate's body record), fold rows are then
// changed, deleted or planted as the superuser, and every change must come back as exactly one
// finding naming its table, key, column and seq.
#include "journal/folds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "admission/attachments.h"
#include "admission/claims.h"
#include "common/sync_point.h"
#include "common/sync_point_testing.h"
#include "common/temp_dir_testing.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "db/test_cluster.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::journal {
namespace {

class FoldsPgTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static auto* tj = new testing::TestJournal(8);
    pool_ = &tj->pool;
    journal_ = &tj->journal;
    oml::testing::ScopedTempDir tmp("oml-folds-test");
    const std::string kek_file = (tmp.path() / "kek.key").string();
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    checks_ = new WorkPool(2);
  }
  void TearDown() override { SyncPoints::ClearAll(); }

  // A tenant with one writer key (principal alice, seq 2) and one claim by it (seq 3).
  struct Tenant {
    std::string id, name, writer_key_id, artifact_id;
    admission::Caller alice;
  };
  static Tenant MakeTenant(const std::string& name) {
    Tenant t;
    auto created = CreateTenant(*journal_, name);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    t.id = created->tenant_id;
    t.name = name;
    auto key = CreateApiKey(*journal_, t.id, "alice", "writer");
    EXPECT_TRUE(key.ok()) << key.status().ToString();
    EXPECT_EQ(key->receipt.seq, 2);
    t.writer_key_id = key->key_id;
    t.alice = {t.id, "alice", "writer", key->key_id, crypto::Sha256(key->token)};
    auto claim = Submit(t.alice, "hello");
    EXPECT_EQ(claim.second, 3);
    t.artifact_id = claim.first;
    return t;
  }
  // (artifact_id, seq)
  static std::pair<std::string, int64_t> Submit(const admission::Caller& c, const std::string& body) {
    admission::Claims claims(journal_, pool_, kek_, 1 << 20);
    auto r = claims.Submit(c, {body, "wa-1", "notes/a.md", "agent", std::nullopt, "text/plain"});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::make_pair(r->meta.artifact_id, r->receipt.seq) : std::make_pair(std::string(), int64_t{0});
  }

  static FoldReport Verify(const std::string& only_tenant, int page_rows = 0) {
    FoldOptions o;
    o.only_tenant = only_tenant;
    o.page_rows = page_rows;
    auto r = VerifyFolds(*pool_, *checks_, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : FoldReport{};
  }
  static std::vector<std::string> Lines(const FoldReport& r) {
    std::vector<std::string> out;
    for (const auto& d : r.diffs) out.push_back(FormatFoldDiff(d));
    return out;
  }
  // As the superuser; `replica` also skips triggers and foreign keys (what an attacker with the
  // superuser would do to get past a guard trigger or a constraint).
  static void Su(const std::string& sql, bool replica = false) {
    auto c = db::Conn::Connect(db::testing::SuperuserUrl());
    ASSERT_TRUE(c.ok());
    auto r = c->Exec(replica ? "SET session_replication_role = replica; " + sql : sql);
    ASSERT_TRUE(r.ok()) << sql << ": " << r.status().ToString();
  }
  static std::string SuValue(const std::string& sql) {
    auto c = db::Conn::Connect(db::testing::SuperuserUrl());
    auto r = c->Exec(sql);
    EXPECT_TRUE(r.ok()) << sql << ": " << (r.ok() ? "" : r.status().ToString());
    return r.ok() && r->size() > 0 ? r->Get(0, 0) : "";
  }

  static db::Pool* pool_;
  static Journal* journal_;
  static crypto::FileKekProvider* kek_;
  static WorkPool* checks_;
};
db::Pool* FoldsPgTest::pool_ = nullptr;
Journal* FoldsPgTest::journal_ = nullptr;
crypto::FileKekProvider* FoldsPgTest::kek_ = nullptr;
WorkPool* FoldsPgTest::checks_ = nullptr;

// Runs first (declaration order): every event type with a fold, nothing tampered. Zero findings,
// every journal event replayed and every fold row read, whatever the page size.
TEST_F(FoldsPgTest, UntouchedDeploymentHasNoFindingsAtAnyPageSize) {
  Tenant t = MakeTenant("clean");
  auto reviewer = CreateApiKey(*journal_, t.id, "rita", "reviewer");  // seq 4
  ASSERT_TRUE(reviewer.ok());
  ASSERT_TRUE(RevokeApiKey(*journal_, t.id, reviewer->key_id, "gone").ok());  // seq 5
  auto second = Submit(t.alice, "second");                                  // seq 6
  admission::Claims claims(journal_, pool_, kek_, 1 << 20);
  ASSERT_TRUE(claims.Erase(t.alice, second.first, "oops").ok());  // seq 7
  MakeTenant("clean-2");

  const int64_t events = std::stoll(SuValue("SELECT count(*) FROM oml.journal"));
  const int64_t rows = std::stoll(SuValue("SELECT (SELECT count(*) FROM oml.tenants) + (SELECT count(*) FROM "
                                          "oml.signing_keys) + (SELECT count(*) FROM oml.api_keys) + "
                                          "(SELECT count(*) FROM oml.artifacts)"));
  EXPECT_EQ(rows, 3 + 1 + 3 + 3);  // provider, clean, clean-2; one key; alice, rita, alice; 2 + 1 claims
  for (int page : {0, 1, 2}) {
    FoldReport r = Verify("", page);
    EXPECT_EQ(Lines(r), std::vector<std::string>{}) << "page " << page;
    EXPECT_EQ(r.tenants, 3) << "page " << page;
    EXPECT_EQ(r.events, events) << "page " << page;
    EXPECT_EQ(r.rows, rows) << "page " << page;
  }
}

TEST_F(FoldsPgTest, HandPromotedOrReownedClaimIsOneFinding) {
  Tenant t = MakeTenant("promote");
  const std::string where = " WHERE artifact_id = '" + t.artifact_id + "'";
  Su("UPDATE oml.artifacts SET state = 'promoted'" + where);
  FoldReport r = Verify("promote");
  ASSERT_EQ(r.diffs.size(), 1u) << ::testing::PrintToString(Lines(r));
  const FoldDiff& d = r.diffs[0];
  EXPECT_EQ(d.table, "artifacts");
  EXPECT_EQ(d.tenant_id, t.id);
  EXPECT_EQ(d.key, t.artifact_id + " v1");
  EXPECT_EQ(d.column, "state");
  EXPECT_EQ(d.expected, "held");
  EXPECT_EQ(d.actual, "promoted");
  EXPECT_EQ(d.kind, FoldDiffKind::kChanged);
  EXPECT_EQ(d.seq, 3);
  EXPECT_EQ(FormatFoldDiff(d), "FOLD artifacts tenant promote " + t.artifact_id + " v1: state expected held, found promoted (seq 3)");

  Su("UPDATE oml.artifacts SET state = 'held', principal = 'mallory'" + where);
  EXPECT_EQ(Lines(Verify("promote")),
            std::vector<std::string>{"FOLD artifacts tenant promote " + t.artifact_id +
                                     " v1: principal expected alice, found mallory (seq 3)"});

  // An erased claim put back: both columns the erasure wrote, at the erasure's seq.
  Su("UPDATE oml.artifacts SET principal = 'alice'" + where);
  admission::Claims claims(journal_, pool_, kek_, 1 << 20);
  ASSERT_TRUE(claims.Erase(t.alice, t.artifact_id, "").ok());  // seq 4
  EXPECT_EQ(Lines(Verify("promote")), std::vector<std::string>{});
  Su("UPDATE oml.artifacts SET state = 'held', erased_seq = NULL" + where);
  EXPECT_EQ(Lines(Verify("promote")),
            (std::vector<std::string>{
                "FOLD artifacts tenant promote " + t.artifact_id + " v1: erased_seq expected 4, found NULL (seq 4)",
                "FOLD artifacts tenant promote " + t.artifact_id + " v1: state expected erased, found held (seq 4)"}));
}

TEST_F(FoldsPgTest, DeletedAndPlantedArtifactRows) {
  Tenant t = MakeTenant("artifacts");
  Su("DELETE FROM oml.artifact_bodies WHERE artifact_id = '" + t.artifact_id + "'; "
     "DELETE FROM oml.artifacts WHERE artifact_id = '" + t.artifact_id + "'");
  const std::string planted = "11111111-2222-4333-8444-555555555555";
  Su("INSERT INTO oml.artifacts (tenant_id, artifact_id, version, workarea_id, path, principal, writer_key_id, provenance, "
     "media_type, size_bytes, plaintext_sha256, ciphertext_sha256, state, submitted_seq) VALUES ('" + t.id + "', '" +
     planted + "', 1, 'wa-1', 'x.md', 'mallory', 'ak_0000000000000000', 'human', 'text/plain', 1, "
     "sha256('x'), sha256('y'), 'promoted', 3)");
  FoldReport r = Verify("artifacts");
  std::vector<std::string> expected = {"FOLD artifacts tenant artifacts " + planted + " v1: extra row (no event)",
                                       "FOLD artifacts tenant artifacts " + t.artifact_id + " v1: missing row (seq 3)"};
  std::sort(expected.begin(), expected.end());  // ordered by artifact id
  EXPECT_EQ(Lines(r), expected);
  ASSERT_EQ(r.diffs.size(), 2u);
  const bool extra_first = r.diffs[0].key == planted + " v1";
  const FoldDiff& extra = r.diffs[extra_first ? 0 : 1];
  const FoldDiff& missing = r.diffs[extra_first ? 1 : 0];
  EXPECT_EQ(extra.kind, FoldDiffKind::kExtra);
  EXPECT_EQ(extra.seq, 0);
  EXPECT_EQ(missing.kind, FoldDiffKind::kMissing);
  EXPECT_EQ(missing.key, t.artifact_id + " v1");
  EXPECT_EQ(missing.seq, 3);
}

TEST_F(FoldsPgTest, DeletedPlantedAndUnrevokedApiKeys) {
  Tenant t = MakeTenant("keys");
  auto admin = CreateApiKey(*journal_, t.id, "ada", "admin");  // seq 4
  ASSERT_TRUE(admin.ok());
  ASSERT_TRUE(RevokeApiKey(*journal_, t.id, admin->key_id, "").ok());  // seq 5
  EXPECT_EQ(Lines(Verify("keys")), std::vector<std::string>{});

  Su("DELETE FROM oml.api_keys WHERE tenant_id = '" + t.id + "' AND principal = 'alice'");
  EXPECT_EQ(Lines(Verify("keys")),
            std::vector<std::string>{"FOLD api_keys tenant keys " + t.writer_key_id + ": missing row (seq 2)"});

  const std::string planted_id = ApiKeyId(crypto::Sha256("planted"));
  Su("INSERT INTO oml.api_keys (key_hash, tenant_id, principal, role) VALUES (sha256('planted'), '" + t.id +
     "', 'mallory', 'admin')");
  FoldReport r = Verify("keys");
  ASSERT_EQ(r.diffs.size(), 2u) << ::testing::PrintToString(Lines(r));
  const FoldDiff& extra = r.diffs[0].kind == FoldDiffKind::kExtra ? r.diffs[0] : r.diffs[1];
  EXPECT_EQ(FormatFoldDiff(extra), "FOLD api_keys tenant keys " + planted_id + ": extra row (no event)");
  EXPECT_EQ(extra.table, "api_keys");
  EXPECT_EQ(extra.key, planted_id);

  // The revoked admin key brought back to life, and its role raised on the way.
  Su("DELETE FROM oml.api_keys WHERE key_hash = sha256('planted')");
  Su("UPDATE oml.api_keys SET revoked_at = NULL, revoked_seq = NULL WHERE principal = 'ada' AND tenant_id = '" + t.id + "'");
  std::vector<std::string> expected = {
      "FOLD api_keys tenant keys " + admin->key_id + ": revoked_at expected non-NULL, found NULL (seq 5)",
      "FOLD api_keys tenant keys " + admin->key_id + ": revoked_seq expected 5, found NULL (seq 5)",
      "FOLD api_keys tenant keys " + t.writer_key_id + ": missing row (seq 2)"};
  std::sort(expected.begin(), expected.end());  // the report is ordered by key id, which is random
  EXPECT_EQ(Lines(Verify("keys")), expected);
}

// A deleted tenants row (its dependents left in place, past the foreign keys), a renamed one and
// a planted one, with a planted API key under it. Customer chains are still found (from
// tenant.created), so the deleted tenant's own rows are still compared.
TEST_F(FoldsPgTest, DeletedRenamedAndPlantedTenants) {
  Tenant gone = MakeTenant("gone");
  Tenant renamed = MakeTenant("renamed");
  const std::string gone_seq = SuValue("SELECT created_seq FROM oml.tenants WHERE name = 'gone'");
  const std::string renamed_seq = SuValue("SELECT created_seq FROM oml.tenants WHERE name = 'renamed'");
  Su("DELETE FROM oml.tenants WHERE tenant_id = '" + gone.id + "'", /*replica=*/true);
  Su("UPDATE oml.tenants SET name = 'other' WHERE tenant_id = '" + renamed.id + "'");
  const std::string planted = "99999999-8888-4777-8666-555555555555";
  Su("INSERT INTO oml.tenants (tenant_id, name) VALUES ('" + planted + "', 'planted'); "
     "INSERT INTO oml.api_keys (key_hash, tenant_id, principal, role) VALUES (sha256('p2'), '" + planted + "', 'm', 'admin')");

  // Only the provider: its tables, no customer rows.
  EXPECT_EQ(Lines(Verify("provider")),
            (std::vector<std::string>{"FOLD tenants tenant gone " + gone.id + ": missing row (seq " + gone_seq + ")",
                                      "FOLD tenants tenant planted " + planted + ": extra row (no event)",
                                      "FOLD tenants tenant renamed " + renamed.id + ": name expected renamed, found other (seq " +
                                          renamed_seq + ")"}));
  // The deleted tenant's chain is still replayed: its own rows agree.
  FoldReport only_gone = Verify("gone");
  EXPECT_EQ(Lines(only_gone), std::vector<std::string>{});
  EXPECT_EQ(only_gone.rows, 2);  // its API key and its claim
  // Everything: the same three, plus the planted tenant's key (nothing anchors that tenant).
  // (Other tests' tenants are left out: they may hold their own tampering.)
  std::vector<std::string> mine;
  for (const auto& d : Verify("").diffs)
    if (d.tenant_name == "gone" || d.tenant_name == "renamed" || d.tenant_name == "planted") mine.push_back(FormatFoldDiff(d));
  EXPECT_EQ(mine.size(), 4u) << ::testing::PrintToString(mine);
  EXPECT_EQ(Lines(Verify("planted")),
            std::vector<std::string>{"FOLD api_keys tenant planted " + ApiKeyId(crypto::Sha256("p2")) + ": extra row (no event)"});

  // Put everything back for the tests after this one.
  Su("DELETE FROM oml.api_keys WHERE tenant_id = '" + planted + "'; DELETE FROM oml.tenants WHERE tenant_id = '" + planted +
     "'; UPDATE oml.tenants SET name = 'renamed' WHERE tenant_id = '" + renamed.id + "'; "
     "INSERT INTO oml.tenants (tenant_id, name, created_seq) VALUES ('" + gone.id + "', 'gone', " + gone_seq + ")");
  EXPECT_EQ(Lines(Verify("provider")), std::vector<std::string>{});
}

// After a rotation the old key must be retired; un-retiring it (past the signing_keys guard
// trigger) is a finding at the rotation's seq.
TEST_F(FoldsPgTest, UnretiredSigningKeyAfterRotation) {
  auto next = crypto::SigningKey::Generate();
  ASSERT_TRUE(next.ok());
  static auto* next_key = new crypto::SigningKey(std::move(next).value());
  const std::string old_id = journal_->key().key_id();
  auto rc = IssueKey(*journal_, *next_key);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  journal_ = new Journal(pool_, next_key);  // the tests after this one sign with the new key
  EXPECT_EQ(Lines(Verify("provider")), std::vector<std::string>{});

  Su("UPDATE oml.signing_keys SET retired_at = NULL WHERE key_id = '" + old_id + "'", /*replica=*/true);
  FoldReport r = Verify("provider");
  ASSERT_EQ(r.diffs.size(), 1u) << ::testing::PrintToString(Lines(r));
  EXPECT_EQ(r.diffs[0].table, "signing_keys");
  EXPECT_EQ(r.diffs[0].tenant_name, "provider");
  EXPECT_EQ(r.diffs[0].seq, rc->seq);
  EXPECT_EQ(FormatFoldDiff(r.diffs[0]), "FOLD signing_keys tenant provider " + old_id +
                                            ": retired_at expected non-NULL, found NULL (seq " + std::to_string(rc->seq) + ")");
  Su("UPDATE oml.signing_keys SET retired_at = now() WHERE key_id = '" + old_id + "'", /*replica=*/true);
  EXPECT_EQ(Lines(Verify("provider")), std::vector<std::string>{});
}

// Rows that commit while a chain is being replayed belong to a later snapshot than the one the
// chain was read in: they are neither extra nor missing. The n-th chain pass is held after its
// replay (before the fold tables are read) while another transaction commits an event and its
// fold rows.
TEST_F(FoldsPgTest, WritesDuringTheReplayAreOutsideItsSnapshot) {
  Tenant t = MakeTenant("busy");
  auto verify_while = [&](const std::string& only, int n, const std::function<void()>& write) -> FoldReport {
    std::atomic<int> calls{0};
    std::mutex mu;
    std::condition_variable cv;
    bool released = false;  // GUARDED_BY(mu)
    SyncPoints::Set("folds.after_replay", [&] {
      if (++calls == n) {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return released; });
      }
      return Status::Ok();
    });
    Result<FoldReport> r = Status(Code::kInternal, "unset");
    std::thread verifier([&] {
      FoldOptions o;
      o.only_tenant = only;
      r = VerifyFolds(*pool_, *checks_, o);
    });
    oml::testing::WaitUntil([&] { return calls.load() >= n; }, "chain pass held after its replay");
    write();
    {
      std::lock_guard<std::mutex> l(mu);
      released = true;
    }
    cv.notify_all();
    verifier.join();
    SyncPoints::Clear("folds.after_replay");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : FoldReport{};
  };
  // The provider pass (the only one) held while a tenant is created: tenant.created and its
  // `tenants` row are both outside the snapshot.
  const int64_t tenants = std::stoll(SuValue("SELECT count(*) FROM oml.tenants"));
  FoldReport provider = verify_while("provider", 1, [&] { ASSERT_TRUE(CreateTenant(*journal_, "busy-late").ok()); });
  EXPECT_EQ(Lines(provider), std::vector<std::string>{});
  EXPECT_EQ(provider.rows, tenants + std::stoll(SuValue("SELECT count(*) FROM oml.signing_keys")));
  // busy's pass (the second; the provider's is the first) held while a claim commits.
  FoldReport busy = verify_while("busy", 2, [&] { EXPECT_EQ(Submit(t.alice, "late").second, 4); });
  EXPECT_EQ(Lines(busy), std::vector<std::string>{});
  EXPECT_EQ(busy.rows, 2);  // alice's key and the first claim
  // A pass after both sees them, and still agrees.
  FoldReport after = Verify("busy");
  EXPECT_EQ(Lines(after), std::vector<std::string>{});
  EXPECT_EQ(after.rows, 3);
  EXPECT_EQ(Lines(Verify("provider")), std::vector<std::string>{});
}

// A folded event whose payload the fold cannot read stops that chain's replay: one finding at its
// seq, and none of the tenant's rows are compared (they would all look wrong).
TEST_F(FoldsPgTest, UnreadablePayloadStopsTheChainAtItsSeq) {
  Tenant t = MakeTenant("unreadable");
  EventSpec bad{"claim.submitted", "tester", {{"artifact_id", "x"}}, nlohmann::json::object(), nullptr};
  auto rc = journal_->Append(t.id, bad);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  FoldReport r = Verify("unreadable");
  ASSERT_EQ(r.diffs.size(), 1u) << ::testing::PrintToString(Lines(r));
  EXPECT_EQ(r.diffs[0].kind, FoldDiffKind::kUnreadable);
  EXPECT_EQ(r.diffs[0].seq, 4);
  EXPECT_EQ(FormatFoldDiff(r.diffs[0]).rfind("FOLD journal tenant unreadable seq 4: cannot recompute the folds: "
                                             "claim.submitted payload is malformed: ",
                                             0),
            0u)
      << FormatFoldDiff(r.diffs[0]);
  EXPECT_EQ(r.rows, 0);
  EXPECT_EQ(r.events, 3 + std::stoll(SuValue("SELECT seq FROM oml.chain_heads WHERE tenant_id = '" +
                                             std::string(kProviderTenant) + "'")));
}

// artifacts.body_review (sql/0013) is claim.submitted's `review` as signed (NULL without one), and
// review_served has one row per (claim version, item, reviewer), pointing at the latest
// review.served of it. The events come from the real paths: Claims::Submit with the review gate
// on (an Attachments without buckets: a small body needs none) and Attachments::RecordServed.
TEST_F(FoldsPgTest, BodyReviewAndReviewServedRows) {
  Tenant t = MakeTenant("served");  // alice's key seq 2, her ungated claim seq 3
  auto rita = CreateApiKey(*journal_, t.id, "rita", "reviewer");  // seq 4
  ASSERT_TRUE(rita.ok());
  const admission::Caller reviewer{t.id, "rita", "reviewer", rita->key_id, crypto::Sha256(rita->token)};
  admission::Attachments atts(pool_, journal_, kek_, nullptr, nullptr, nullptr, review::Options{},
                              admission::AttachmentsOptions{});
  admission::Claims gated(journal_, pool_, kek_, 1 << 20);
  gated.set_attachments(&atts);
  auto sub = gated.Submit(t.alice, {"gated body", "wa-1", "notes/b.md", "agent", std::nullopt, "text/plain"});
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  ASSERT_EQ(sub->receipt.seq, 5);
  const std::string gated_id = sub->meta.artifact_id, plain_id = t.artifact_id;
  auto serve = [&](const std::string& artifact_id) {
    admission::ClaimMeta m;
    m.artifact_id = artifact_id;
    m.state = "held";
    Status st = atts.RecordServed(reviewer, m, 0, crypto::Sha256("p"), crypto::Sha256("c"));
    EXPECT_TRUE(st.ok()) << st.ToString();
  };
  serve(plain_id);  // seq 6
  serve(gated_id);  // seq 7
  ASSERT_EQ(SuValue("SELECT string_agg(served_seq::text, ',' ORDER BY served_seq) FROM oml.review_served WHERE "
                    "tenant_id = '" + t.id + "'"),
            "6,7");
  const std::string signed_review =
      nlohmann::json::parse(SuValue("SELECT convert_from(signed_bytes, 'UTF8') FROM oml.journal WHERE tenant_id = '" +
                                    t.id + "' AND seq = 5"))["payload"]["review"]
          .dump();
  EXPECT_EQ(signed_review,
            R"({"deny_list_hits":[],"flags":[],"hits_truncated":false,"method":"text","review":"text-extraction"})");
  for (int page : {0, 1, 2}) {
    FoldReport r = Verify("served", page);
    EXPECT_EQ(Lines(r), std::vector<std::string>{}) << "page " << page;
    EXPECT_EQ(r.rows, 2 + 2 + 2) << "page " << page;  // keys alice, rita; two claims; two served rows
  }

  // body_review: changed, removed, planted on a claim signed without one. Key order and spacing
  // are jsonb's, not compared.
  const std::string gated_where = " WHERE artifact_id = '" + gated_id + "'";
  const std::string plain_where = " WHERE artifact_id = '" + plain_id + "'";
  Su("UPDATE oml.artifacts SET body_review = '{\"review\": \"text-extraction\", \"method\": \"text\", "
     "\"flags\": [], \"hits_truncated\": false, \"deny_list_hits\": []}'" + gated_where);
  EXPECT_EQ(Lines(Verify("served")), std::vector<std::string>{});
  Su("UPDATE oml.artifacts SET body_review = jsonb_set(body_review, '{flags}', '[\"x\"]')" + gated_where);
  FoldReport changed = Verify("served");
  ASSERT_EQ(changed.diffs.size(), 1u) << ::testing::PrintToString(Lines(changed));
  const FoldDiff& d = changed.diffs[0];
  EXPECT_EQ(d.table, "artifacts");
  EXPECT_EQ(d.tenant_id, t.id);
  EXPECT_EQ(d.key, gated_id + " v1");
  EXPECT_EQ(d.column, "body_review");
  EXPECT_EQ(d.expected, signed_review);
  EXPECT_EQ(d.actual,
            R"({"deny_list_hits":[],"flags":["x"],"hits_truncated":false,"method":"text","review":"text-extraction"})");
  EXPECT_EQ(d.kind, FoldDiffKind::kChanged);
  EXPECT_EQ(d.seq, 5);
  Su("UPDATE oml.artifacts SET body_review = NULL" + gated_where);
  Su("UPDATE oml.artifacts SET body_review = '{\"flags\": []}'" + plain_where);
  std::vector<std::string> expected = {
      "FOLD artifacts tenant served " + gated_id + " v1: body_review expected " + signed_review + ", found NULL (seq 5)",
      "FOLD artifacts tenant served " + plain_id + " v1: body_review expected NULL, found {\"flags\":[]} (seq 3)"};
  std::sort(expected.begin(), expected.end());  // ordered by artifact id
  EXPECT_EQ(Lines(Verify("served")), expected);
  Su("UPDATE oml.artifacts SET body_review = NULL" + plain_where);
  Su("UPDATE oml.artifacts SET body_review = '" + signed_review + "'" + gated_where);
  EXPECT_EQ(Lines(Verify("served")), std::vector<std::string>{});

  // review_served: served_seq pointed elsewhere.
  const std::string gated_key = gated_id + " v1 item 0 reviewer rita", plain_key = plain_id + " v1 item 0 reviewer rita";
  Su("UPDATE oml.review_served SET served_seq = 4" + gated_where);
  FoldReport moved = Verify("served");
  ASSERT_EQ(moved.diffs.size(), 1u) << ::testing::PrintToString(Lines(moved));
  EXPECT_EQ(moved.diffs[0].table, "review_served");
  EXPECT_EQ(moved.diffs[0].key, gated_key);
  EXPECT_EQ(moved.diffs[0].column, "served_seq");
  EXPECT_EQ(moved.diffs[0].expected, "7");
  EXPECT_EQ(moved.diffs[0].actual, "4");
  EXPECT_EQ(moved.diffs[0].kind, FoldDiffKind::kChanged);
  EXPECT_EQ(moved.diffs[0].seq, 7);
  EXPECT_EQ(FormatFoldDiff(moved.diffs[0]),
            "FOLD review_served tenant served " + gated_key + ": served_seq expected 7, found 4 (seq 7)");
  // The row no longer names a review.served, so the next serve journals again (seq 8) and its
  // fold (ON CONFLICT DO UPDATE) points the row at it: the latest serve defines served_seq.
  serve(gated_id);
  EXPECT_EQ(SuValue("SELECT served_seq FROM oml.review_served" + gated_where), "8");
  EXPECT_EQ(Lines(Verify("served")), std::vector<std::string>{});
  Su("UPDATE oml.review_served SET served_seq = 7" + gated_where);
  EXPECT_EQ(Lines(Verify("served")),
            std::vector<std::string>{"FOLD review_served tenant served " + gated_key +
                                     ": served_seq expected 8, found 7 (seq 8)"});
  Su("UPDATE oml.review_served SET served_seq = 8" + gated_where);

  // A deleted row (a serve undone) and a planted one (a serve that never happened).
  Su("DELETE FROM oml.review_served" + plain_where);
  Su("INSERT INTO oml.review_served (tenant_id, artifact_id, version, item, reviewer, served_seq) VALUES ('" + t.id +
     "', '" + gated_id + "', 1, 0, 'mallory', 8)");
  FoldReport r = Verify("served");
  expected = {"FOLD review_served tenant served " + plain_key + ": missing row (seq 6)",
              "FOLD review_served tenant served " + gated_id + " v1 item 0 reviewer mallory: extra row (no event)"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(Lines(r), expected);
  ASSERT_EQ(r.diffs.size(), 2u);
  const bool missing_first = r.diffs[0].kind == FoldDiffKind::kMissing;
  const FoldDiff& missing = r.diffs[missing_first ? 0 : 1];
  const FoldDiff& extra = r.diffs[missing_first ? 1 : 0];
  EXPECT_EQ(missing.table, "review_served");
  EXPECT_EQ(missing.key, plain_key);
  EXPECT_EQ(missing.seq, 6);
  EXPECT_EQ(extra.table, "review_served");
  EXPECT_EQ(extra.key, gated_id + " v1 item 0 reviewer mallory");
  EXPECT_EQ(extra.kind, FoldDiffKind::kExtra);
  EXPECT_EQ(extra.seq, 0);
  Su("DELETE FROM oml.review_served WHERE reviewer = 'mallory' AND tenant_id = '" + t.id + "'");
  Su("INSERT INTO oml.review_served (tenant_id, artifact_id, version, item, reviewer, served_seq) VALUES ('" + t.id +
     "', '" + plain_id + "', 1, 0, 'rita', 6)");
  EXPECT_EQ(Lines(Verify("served")), std::vector<std::string>{});
}

// review_progress has no event (a reviewer's Range reads write it): its values are not compared,
// but a row must name an attachment a submission.attach defines. This claim has none, so planted
// attachments rows are extra, and so are progress rows (a planted attachment does not anchor
// them); three of each, read at every page size.
TEST_F(FoldsPgTest, PlantedAttachmentAndReviewProgressRowsAtAnyPageSize) {
  Tenant t = MakeTenant("progress");
  for (int n = 1; n <= 3; ++n) {
    const std::string item = std::to_string(n);
    Su("INSERT INTO oml.attachments (tenant_id, artifact_id, version, ordinal, upload_id, plaintext_sha256, "
       "ciphertext_sha256, size_bytes, ciphertext_size, media_type, object_key, review, flagged, attach_seq) VALUES ('" +
       t.id + "', '" + t.artifact_id + "', 1, " + item + ", gen_random_uuid(), sha256('p'), sha256('c'), 5, 33, "
       "'text/plain', 'k" + item + "', '{}', false, 3)");
    Su("INSERT INTO oml.review_progress (tenant_id, artifact_id, version, item, reviewer, served_upto, covered) "
       "VALUES ('" + t.id + "', '" + t.artifact_id + "', 1, " + item + ", 'rita', 5, '{[0,5)}')");
  }
  const std::string a = "FOLD attachments tenant progress " + t.artifact_id + " v1 attachment ";
  const std::string p = "FOLD review_progress tenant progress " + t.artifact_id + " v1 item ";
  for (int page : {0, 1, 2}) {
    FoldReport r = Verify("progress", page);
    EXPECT_EQ(Lines(r), (std::vector<std::string>{a + "1: extra row (no event)", a + "2: extra row (no event)",
                                                   a + "3: extra row (no event)", p + "1 reviewer rita: extra row (no event)",
                                                   p + "2 reviewer rita: extra row (no event)",
                                                   p + "3 reviewer rita: extra row (no event)"}))
        << "page " << page;
    EXPECT_EQ(r.rows, 2 + 3 + 3) << "page " << page;  // alice's key, the claim, the planted rows
    ASSERT_EQ(r.diffs.size(), 6u);
    const FoldDiff& d = r.diffs[3];
    EXPECT_EQ(d.table, "review_progress");
    EXPECT_EQ(d.tenant_id, t.id);
    EXPECT_EQ(d.tenant_name, "progress");
    EXPECT_EQ(d.key, t.artifact_id + " v1 item 1 reviewer rita");
    EXPECT_EQ(d.column, "");
    EXPECT_EQ(d.kind, FoldDiffKind::kExtra);
    EXPECT_EQ(d.seq, 0);
    EXPECT_EQ(r.diffs[0].table, "attachments");
    EXPECT_EQ(r.diffs[0].key, t.artifact_id + " v1 attachment 1");
    EXPECT_EQ(r.diffs[0].kind, FoldDiffKind::kExtra);
  }
  Su("DELETE FROM oml.review_progress WHERE tenant_id = '" + t.id + "'; DELETE FROM oml.attachments WHERE tenant_id = '" +
     t.id + "'");
  EXPECT_EQ(Lines(Verify("progress")), std::vector<std::string>{});
}

TEST_F(FoldsPgTest, UnknownTenantIsNotFound) {
  FoldOptions o;
  o.only_tenant = "no-such-tenant";
  auto r = VerifyFolds(*pool_, *checks_, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().type(), "tenant-not-found");
}

}  // namespace
}  // namespace oml::journal
