// Claims against a real PostgreSQL cluster: digest-only events, encrypted bodies, integrity,
// crypto-shredding, own-work rule.
#include "admission/claims.h"
#include "common/temp_dir_testing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "common/sync_point_testing.h"
#include "db/test_cluster.h"
#include "journal/canonical_json.h"
#include "journal/provider.h"
#include "journal/test_journal.h"

namespace oml::admission {
namespace {

class ClaimsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    static auto* tj = new journal::testing::TestJournal(4);
    pool_ = &tj->pool;
    journal_ = &tj->journal;
    oml::testing::ScopedTempDir tmp("oml-claims-test");
    const std::string kek_file = (tmp.path() / "kek.key").string();
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    claims_ = new Claims(journal_, pool_, kek_, 64);
    tenant_ = journal::CreateTenant(*journal_, "claims").value().tenant_id;
  }
  static Caller As(const std::string& principal, const std::string& role) { return {tenant_, principal, role, "ak_test"}; }
  static SubmitRequest Req(const std::string& body) { return {body, "wa-1", "notes/a.md", "agent", std::nullopt, "text/plain"}; }

  static db::Pool* pool_;
  static journal::Journal* journal_;
  static crypto::FileKekProvider* kek_;
  static Claims* claims_;
  static std::string tenant_;
};
db::Pool* ClaimsTest::pool_;
journal::Journal* ClaimsTest::journal_;
crypto::FileKekProvider* ClaimsTest::kek_;
Claims* ClaimsTest::claims_;
std::string ClaimsTest::tenant_;

// A write made with an API key races that key's revocation. The revoke holds the tenant's chain
// lock (paused before its COMMIT); the submit, authenticated before, queues behind it and is
// refused by its own transaction. No claim by the key can follow its api_key.revoked.
TEST_F(ClaimsTest, WriteQueuedBehindItsKeysRevocationIsRefused) {
  auto t = journal::CreateTenant(*journal_, "revoked-writer");
  ASSERT_TRUE(t.ok());
  auto key = journal::CreateApiKey(*journal_, t->tenant_id, "carol", "writer");  // seq 2
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  const Caller carol{t->tenant_id, "carol", "writer", key->key_id, crypto::Sha256(key->token)};
  auto before = claims_->Submit(carol, Req("before"));  // seq 3: the key is live
  ASSERT_TRUE(before.ok()) << before.status().ToString();

  oml::testing::HoldFirst hold("journal.after_outbox_insert");  // the revoke, before COMMIT
  Result<journal::Receipt> revoked = Status(Code::kInternal, "unset");
  Result<SubmitResult> late = Status(Code::kInternal, "unset");
  std::thread a([&] { revoked = journal::RevokeApiKey(*journal_, t->tenant_id, key->key_id, "lost"); });
  hold.WaitUntilHeld();
  std::thread b([&] { late = claims_->Submit(carol, Req("after")); });
  oml::testing::WaitUntil([&] { return journal_->QueueDepth(t->tenant_id) >= 1; }, "submit queued");
  hold.Release();
  a.join();
  b.join();
  ASSERT_TRUE(revoked.ok()) << revoked.status().ToString();
  EXPECT_EQ(revoked->seq, 4);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), Code::kUnauthenticated);
  EXPECT_EQ(late.status().message(), "API key " + key->key_id + " is revoked");
  // The operator (no API key) is not subject to the check; the chain ends at the revocation.
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su.ok());
  auto n = su->Query("SELECT (SELECT max(seq) FROM oml.journal WHERE tenant_id = $1) || '/' || "
                     "(SELECT count(*) FROM oml.artifacts WHERE tenant_id = $1)",
                     {db::Text(t->tenant_id)});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->Get(0, 0), "4/1");
  EXPECT_EQ(claims_->Erase(carol, before->meta.artifact_id, "").status().code(), Code::kUnauthenticated);
  EXPECT_TRUE(claims_->Erase({t->tenant_id, "operator", "admin", "cli"}, before->meta.artifact_id, "").ok());
}

TEST_F(ClaimsTest, SubmitSignsDigestsOnlyAndFetchDecrypts) {
  auto s = claims_->Submit(As("alice", "writer"), Req("the body"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->receipt.signed_bytes.find("the body"), std::string::npos);
  auto env = journal::Envelope::FromSignedBytes(s->receipt.signed_bytes);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->payload["plaintext_sha256"], crypto::Hex(crypto::Sha256("the body")));
  auto f = claims_->Fetch(As("alice", "writer"), s->meta.artifact_id);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->body, "the body");
  EXPECT_EQ(claims_->Fetch(As("bob", "writer"), s->meta.artifact_id).status().code(), Code::kNotFound);
  EXPECT_TRUE(claims_->Fetch(As("rita", "reviewer"), s->meta.artifact_id).ok());
}

TEST_F(ClaimsTest, LimitsAndRoles) {
  EXPECT_EQ(claims_->Submit(As("alice", "writer"), Req(std::string(65, 'x'))).status().code(), Code::kPayloadTooLarge);
  EXPECT_EQ(claims_->Submit(As("rita", "reviewer"), Req("x")).status().type(), "forbidden-role");
  auto bad = Req("x");
  bad.provenance = "rumor";
  EXPECT_EQ(claims_->Submit(As("alice", "writer"), bad).status().type(), "invalid-field");
}

TEST_F(ClaimsTest, TamperedCiphertextIsAnIntegrityErrorAndNoBody) {
  auto s = claims_->Submit(As("alice", "writer"), Req("precious"));
  ASSERT_TRUE(s.ok());
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su->Query("UPDATE oml.artifact_bodies SET ciphertext = set_byte(ciphertext, 30, get_byte(ciphertext, 30) # 1) "
                        "WHERE artifact_id = $1",
                        {db::Text(s->meta.artifact_id)})
                  .ok());
  auto f = claims_->Fetch(As("alice", "writer"), s->meta.artifact_id);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kDataLoss);
  EXPECT_EQ(f.status().type(), "integrity");
}

TEST_F(ClaimsTest, EraseShredsTheKeyAndFetchIsGoneWithTheSeq) {
  auto s = claims_->Submit(As("alice", "writer"), Req("forget me"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(claims_->Erase(As("rita", "reviewer"), s->meta.artifact_id, "").status().code(), Code::kPermissionDenied);
  auto e = claims_->Erase(As("alice", "writer"), s->meta.artifact_id, "asked");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto f = claims_->Fetch(As("alice", "writer"), s->meta.artifact_id);
  EXPECT_EQ(f.status().code(), Code::kGone);
  EXPECT_EQ(f.status().message(),
            "claim " + s->meta.artifact_id + " was erased at seq " + std::to_string(e->second.seq));
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  auto n = su->Query("SELECT count(*) FROM oml.artifact_keys WHERE artifact_id = $1", {db::Text(s->meta.artifact_id)});
  EXPECT_EQ(n->Get(0, 0), "0");
  EXPECT_EQ(claims_->Erase(As("alice", "writer"), s->meta.artifact_id, "").status().code(), Code::kGone);
}

// ---- Idempotency-Key (SubmitOnce / EraseOnce, sql/0005) ----------------------------------------

// A tenant with its own writer API key, so the idempotency rows have a real key to point at.
class IdempotencyTest : public ClaimsTest {
 protected:
  struct Writer {
    std::string tenant;
    Caller caller;
  };
  static Writer NewWriter(const std::string& tenant_name, const std::string& principal = "alice") {
    auto t = journal::CreateTenant(*journal_, tenant_name);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return {t->tenant_id, AddKey(t->tenant_id, principal)};
  }
  static Caller AddKey(const std::string& tenant, const std::string& principal) {
    auto k = journal::CreateApiKey(*journal_, tenant, principal, "writer");
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return {tenant, principal, "writer", k->key_id, crypto::Sha256(k->token)};
  }
  static IdempotencyKey Key(const std::string& key, const std::string& request, int64_t ttl_s = 3600) {
    return {key, crypto::Sha256(request), ttl_s};
  }
  // What the HTTP layer renders, reduced: enough to see the seqs and the state recorded.
  static std::pair<int, nlohmann::json> Render(const ClaimMeta& m) {
    return {m.erased_seq ? 200 : 201,
            {{"artifact_id", m.artifact_id},
             {"state", m.state},
             {"submitted_seq", m.submitted_seq},
             {"erased_seq", m.erased_seq ? nlohmann::json(*m.erased_seq) : nlohmann::json(nullptr)}}};
  }
  // "<journal rows>/<claim.submitted rows>/<artifact.erased rows>/<idempotency rows>" of a tenant,
  // as the superuser sees them.
  static std::string Counts(const std::string& tenant) {
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    EXPECT_TRUE(su.ok());
    auto n = su->Query("SELECT (SELECT count(*) FROM oml.journal WHERE tenant_id = $1) || '/' || "
                       "(SELECT count(*) FROM oml.journal WHERE tenant_id = $1 AND event_type = 'claim.submitted') || '/' || "
                       "(SELECT count(*) FROM oml.journal WHERE tenant_id = $1 AND event_type = 'artifact.erased') || '/' || "
                       "(SELECT count(*) FROM oml.idempotency_keys WHERE tenant_id = $1)",
                       {db::Text(tenant)});
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n->Get(0, 0);
  }
  static void ExpectSameReceipt(const journal::Receipt& a, const journal::Receipt& b) {
    EXPECT_EQ(a.ToJson().dump(), b.ToJson().dump());
    EXPECT_EQ(a.signed_bytes, b.signed_bytes);
    EXPECT_EQ(a.signature, b.signature);
  }
};

TEST_F(IdempotencyTest, SameKeySameRequestReplaysTheFirstResponseWithoutASecondEvent) {
  auto w = NewWriter("idem-replay");  // genesis 1, api_key.created 2
  const auto k = Key("order-1", "POST /v1/claims body-1");
  auto first = claims_->SubmitOnce(w.caller, Req("body-1"), k, Render);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->replayed);
  EXPECT_EQ(first->status, 201);
  EXPECT_EQ(first->receipt.seq, 3);
  EXPECT_EQ(first->body["submitted_seq"], 3);
  EXPECT_EQ(Counts(w.tenant), "3/1/0/1");

  auto again = claims_->SubmitOnce(w.caller, Req("body-1"), k, Render);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(again->status, 201);
  EXPECT_EQ(again->body.dump(), first->body.dump());  // receipt included, byte for byte
  ExpectSameReceipt(again->receipt, first->receipt);
  EXPECT_EQ(Counts(w.tenant), "3/1/0/1");

  // The replayed receipt is the journal's: it verifies against the signing key.
  EXPECT_TRUE(journal::VerifyReceipt(again->receipt, journal_->key().public_key()).ok());
}

TEST_F(IdempotencyTest, SameKeyOtherRequestIs422ReusedAndWritesNothing) {
  auto w = NewWriter("idem-reused");
  ASSERT_TRUE(claims_->SubmitOnce(w.caller, Req("body-1"), Key("k", "request-1"), Render).ok());
  auto other = claims_->SubmitOnce(w.caller, Req("body-2"), Key("k", "request-2"), Render);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(other.status().type(), "idempotency-key-reused");
  EXPECT_EQ(Counts(w.tenant), "3/1/0/1");
  // The same request under the key still replays.
  auto same = claims_->SubmitOnce(w.caller, Req("body-1"), Key("k", "request-1"), Render);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->replayed);
}

TEST_F(IdempotencyTest, KeysAreScopedToTheApiKey) {
  auto w = NewWriter("idem-scope");                 // seqs 1, 2
  const Caller bob = AddKey(w.tenant, "bob");       // seq 3
  const auto k = Key("shared", "same request");
  auto a = claims_->SubmitOnce(w.caller, Req("x"), k, Render);
  auto b = claims_->SubmitOnce(bob, Req("x"), k, Render);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(a->replayed);
  EXPECT_FALSE(b->replayed);
  EXPECT_EQ(a->receipt.seq, 4);
  EXPECT_EQ(b->receipt.seq, 5);
  EXPECT_NE(a->body["artifact_id"], b->body["artifact_id"]);
  EXPECT_EQ(Counts(w.tenant), "5/2/0/2");
}

// Three writes queue behind a held transaction and share the next group: two with the same key
// and request, one with another key. The group fails on the duplicate's primary key, is retried
// event by event, and the duplicate is answered from the first one's record: no second event, and
// the neighbour is committed.
TEST_F(IdempotencyTest, DuplicateInAGroupFailsOnlyItselfAndIsAnsweredAsAReplay) {
  auto w = NewWriter("idem-group");  // seqs 1, 2
  const auto k = Key("dup", "the request");
  oml::testing::HoldFirst hold("journal.after_outbox_insert");
  Result<SubmitResult> lead = Status(Code::kInternal, "unset");
  std::thread t0([&] { lead = claims_->Submit(w.caller, Req("lead")); });
  hold.WaitUntilHeld();
  std::vector<Result<WriteResponse>> out(3, Status(Code::kInternal, "unset"));
  std::vector<std::thread> ts;
  ts.emplace_back([&] { out[0] = claims_->SubmitOnce(w.caller, Req("dup"), k, Render); });
  ts.emplace_back([&] { out[1] = claims_->SubmitOnce(w.caller, Req("dup"), k, Render); });
  ts.emplace_back([&] { out[2] = claims_->SubmitOnce(w.caller, Req("other"), Key("other", "other request"), Render); });
  oml::testing::WaitUntil([&] { return journal_->QueueDepth(w.tenant) >= 3; }, "three writes queued");
  hold.Release();
  t0.join();
  for (auto& t : ts) t.join();
  ASSERT_TRUE(lead.ok()) << lead.status().ToString();
  EXPECT_EQ(lead->receipt.seq, 3);
  for (auto& r : out) ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(out[0]->replayed + out[1]->replayed, 1);
  EXPECT_EQ(out[0]->body.dump(), out[1]->body.dump());
  ExpectSameReceipt(out[0]->receipt, out[1]->receipt);
  EXPECT_FALSE(out[2]->replayed);
  EXPECT_NE(out[2]->receipt.seq, out[0]->receipt.seq);
  EXPECT_EQ(std::min(out[0]->receipt.seq, out[2]->receipt.seq), 4);
  EXPECT_EQ(std::max(out[0]->receipt.seq, out[2]->receipt.seq), 5);
  EXPECT_EQ(Counts(w.tenant), "5/3/0/2");
}

TEST_F(IdempotencyTest, ConcurrentIdenticalRequestsWriteOneEvent) {
  auto w = NewWriter("idem-race");
  const auto k = Key("race", "the request");
  std::vector<Result<WriteResponse>> out(12, Status(Code::kInternal, "unset"));
  std::vector<std::thread> ts;
  for (size_t i = 0; i < out.size(); ++i)
    ts.emplace_back([&, i] { out[i] = claims_->SubmitOnce(w.caller, Req("same"), k, Render); });
  for (auto& t : ts) t.join();
  int fresh = 0;
  for (auto& r : out) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    fresh += !r->replayed;
    EXPECT_EQ(r->receipt.seq, 3);
    EXPECT_EQ(r->body.dump(), out[0]->body.dump());
  }
  EXPECT_EQ(fresh, 1);
  EXPECT_EQ(Counts(w.tenant), "3/1/0/1");
}

TEST_F(IdempotencyTest, AnExpiredRecordIsIgnoredAndReplaced) {
  auto w = NewWriter("idem-expiry");
  const auto k = Key("k", "request");
  auto first = claims_->SubmitOnce(w.caller, Req("x"), k, Render);
  ASSERT_TRUE(first.ok());
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su->Query("UPDATE oml.idempotency_keys SET created_at = now() - interval '2 hours', "
                        "expires_at = now() - interval '1 hour' WHERE tenant_id = $1",
                        {db::Text(w.tenant)})
                  .ok());
  auto second = claims_->SubmitOnce(w.caller, Req("x"), k, Render);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->replayed);
  EXPECT_EQ(first->receipt.seq, 3);
  EXPECT_EQ(second->receipt.seq, 4);
  EXPECT_EQ(Counts(w.tenant), "4/2/0/1");  // the expired row was deleted by the new write's fold
  auto third = claims_->SubmitOnce(w.caller, Req("x"), k, Render);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->replayed);
  EXPECT_EQ(third->receipt.seq, 4);
}

TEST_F(IdempotencyTest, EachWriteDeletesAFewExpiredRowsOfItsTenant) {
  auto w = NewWriter("idem-purge");
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(claims_->SubmitOnce(w.caller, Req("x"), Key("k" + std::to_string(i), "r"), Render).ok());
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su->Query("UPDATE oml.idempotency_keys SET created_at = now() - interval '2 hours', "
                        "expires_at = now() - interval '1 hour' WHERE tenant_id = $1",
                        {db::Text(w.tenant)})
                  .ok());
  ASSERT_TRUE(claims_->SubmitOnce(w.caller, Req("x"), Key("new", "r"), Render).ok());
  EXPECT_EQ(Counts(w.tenant), "13/11/0/3");  // 10 expired - 8 purged + 1 new
}

// The insert of a record fails on the primary key, but the row it collided with has expired by the
// time the key is looked up again: nothing to replay, so 409 in-flight (retry), and no event.
TEST_F(IdempotencyTest, ConflictWithoutAVisibleRecordIs409InFlight) {
  auto w = NewWriter("idem-inflight");
  const auto k = Key("k", "request");
  oml::testing::HoldFirst hold("journal.after_outbox_insert");  // our transaction began: now() is fixed
  Result<WriteResponse> out = Status(Code::kInternal, "unset");
  std::thread t([&] { out = claims_->SubmitOnce(w.caller, Req("x"), k, Render); });
  hold.WaitUntilHeld();
  // Another writer's record for the key, committed after our transaction began and expiring 1 s later.
  auto su = db::Conn::Connect(db::testing::SuperuserUrl());
  ASSERT_TRUE(su->Query("INSERT INTO oml.idempotency_keys (tenant_id, api_key_hash, idem_key, request_sha256, "
                        "response_status, response_body, journal_seq, created_at, expires_at) "
                        "VALUES ($1, $2, $3, $4, 201, '{}', 1, clock_timestamp(), clock_timestamp() + interval '1 s')",
                        {db::Text(w.tenant), db::Bytes(w.caller.api_key_hash), db::Text(k.key), db::Bytes(k.request_sha256)})
                  .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  hold.Release();
  t.join();
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(out.status().type(), "idempotency-key-in-flight");
  EXPECT_EQ(Counts(w.tenant), "2/0/0/1");
}

TEST_F(IdempotencyTest, MalformedKeysAndOperatorWritesAreRefusedBeforeWriting) {
  EXPECT_TRUE(Claims::CheckIdempotencyKey(std::string(255, 'k')).ok());
  EXPECT_TRUE(Claims::CheckIdempotencyKey(" !~").ok());
  for (const std::string& bad : {std::string(), std::string(256, 'k'), std::string("a\tb"), std::string("a\x7f"),
                                std::string("\xc3\xa9")}) {
    Status s = Claims::CheckIdempotencyKey(bad);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(s.type(), "invalid-idempotency-key") << bad;
  }
  auto w = NewWriter("idem-malformed");
  auto r = claims_->SubmitOnce(w.caller, Req("x"), Key(std::string(256, 'k'), "r"), Render);
  EXPECT_EQ(r.status().type(), "invalid-idempotency-key");
  auto op = claims_->SubmitOnce({w.tenant, "operator", "admin", "cli"}, Req("x"), Key("k", "r"), Render);
  EXPECT_EQ(op.status().type(), "invalid-idempotency-key");
  EXPECT_EQ(Counts(w.tenant), "2/0/0/0");
}

TEST_F(IdempotencyTest, EraseReplaysToo) {
  auto w = NewWriter("idem-erase");
  auto s = claims_->Submit(w.caller, Req("forget me"));  // seq 3
  ASSERT_TRUE(s.ok());
  const auto k = Key("erase-1", "POST /v1/claims/" + s->meta.artifact_id + "/erase");
  auto first = claims_->EraseOnce(w.caller, s->meta.artifact_id, "asked", k, Render);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(first->replayed);
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(first->body["state"], "erased");
  EXPECT_EQ(first->body["erased_seq"], 4);
  // A plain retry would be 410; with the key it is the first answer again.
  EXPECT_EQ(claims_->Erase(w.caller, s->meta.artifact_id, "asked").status().code(), Code::kGone);
  auto again = claims_->EraseOnce(w.caller, s->meta.artifact_id, "asked", k, Render);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(again->status, 200);
  EXPECT_EQ(again->body.dump(), first->body.dump());
  EXPECT_EQ(Counts(w.tenant), "4/1/1/1");
}

// A 5 MB media_type or reason would be signed into the journal, copied to the outbox and the
// lake, and could never be erased. Every write entry point refuses it with kInvalidArgument
// "invalid-field" before anything else (before the idempotency key is looked up, before the
// claim is), so no row of any table changes; so do the CLI's provider acts.
TEST_F(IdempotencyTest, HugeMediaTypeAndReasonAreRefusedAndNothingIsWritten) {
  auto w = NewWriter("huge-fields");                 // genesis 1, api_key.created 2
  auto kept = claims_->Submit(w.caller, Req("kept"));  // seq 3
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  const std::string id = kept->meta.artifact_id;
  const auto rows = [&] {
    auto su = db::Conn::Connect(db::testing::SuperuserUrl());
    EXPECT_TRUE(su.ok());
    auto n = su->Query("SELECT (SELECT count(*) FROM oml.journal WHERE tenant_id = $1) || '/' || "
                       "(SELECT count(*) FROM oml.outbox WHERE tenant_id = $1) || '/' || "
                       "(SELECT count(*) FROM oml.artifacts WHERE tenant_id = $1 AND state = 'held') || '/' || "
                       "(SELECT count(*) FROM oml.artifact_keys WHERE tenant_id = $1) || '/' || "
                       "(SELECT count(*) FROM oml.api_keys WHERE tenant_id = $1 AND revoked_at IS NULL) || '/' || "
                       "(SELECT count(*) FROM oml.idempotency_keys WHERE tenant_id = $1)",
                       {db::Text(w.tenant)});
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n->Get(0, 0);
  };
  const std::string before = rows();
  EXPECT_EQ(before.substr(0, 2), "3/");

  const std::string huge(5 * 1000 * 1000, 'x');
  const auto refused = [](const Status& st, const std::string& message) {
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.type(), "invalid-field");
    EXPECT_EQ(st.message(), message);
  };
  const std::string media_rule = "media_type must be 1..255 characters; it has more";
  const std::string reason_rule = "reason must be 0..1024 characters; it has more";
  SubmitRequest big = Req("x");
  big.media_type = "text/" + huge;
  refused(claims_->Submit(w.caller, big).status(), media_rule);
  refused(claims_->SubmitOnce(w.caller, big, Key("huge-1", "POST /v1/claims huge"), Render).status(), media_rule);
  big.media_type = "text/plain; charset=\"" + huge + "\"";
  refused(claims_->Submit(w.caller, big).status(), media_rule);

  refused(claims_->Erase(w.caller, id, huge).status(), reason_rule);
  refused(claims_->EraseOnce(w.caller, id, huge, Key("huge-2", "POST erase huge"), Render).status(), reason_rule);
  refused(claims_->Erase({w.tenant, "operator", "admin", "cli"}, id, huge).status(), reason_rule);  // `oml erase`
  // 400 before 404: the reason is checked before the claim is looked up.
  refused(claims_->Erase(w.caller, "00000000-0000-4000-8000-000000000000", huge).status(), reason_rule);

  // `oml key create --principal`, `oml key revoke --reason`, `oml tenant create`.
  refused(journal::CreateApiKey(*journal_, w.tenant, huge, "writer").status(),
          "principal must be 1..200 characters; it has more");
  refused(journal::RevokeApiKey(*journal_, w.tenant, w.caller.api_key_id, huge).status(), reason_rule);
  refused(journal::CreateTenant(*journal_, "Huge-" + huge).status(),
          "tenant name must match ^[a-z0-9][a-z0-9_-]{0,62}$");

  EXPECT_EQ(rows(), before);
  auto f = claims_->Fetch(w.caller, id);  // still held, still readable
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->body, "kept");
}

}  // namespace
}  // namespace oml::admission
