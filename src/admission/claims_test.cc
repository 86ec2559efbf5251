// Claims against a real PostgreSQL cluster: digest-only events, encrypted bodies, integrity,
// crypto-shredding, own-work rule.
#include "admission/claims.h"
#include "common/temp_dir_testing.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

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

}  // namespace
}  // namespace oml::admission
