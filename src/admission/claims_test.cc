// Claims against a real PostgreSQL cluster: digest-only events, encrypted bodies, integrity,
// crypto-shredding, own-work rule.
#include "admission/claims.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "db/test_cluster.h"
#include "journal/canonical_json.h"
#include "journal/provider.h"

namespace oml::admission {
namespace {

class ClaimsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pool_ = new db::Pool(db::testing::AppUrl(), 4);
    key_ = new crypto::SigningKey(std::move(crypto::SigningKey::Generate()).value());
    journal_ = new journal::Journal(pool_, key_);
    ASSERT_TRUE(journal::InitProvider(*journal_).ok());
    std::string kek_file = "/tmp/oml-claims-test-kek-" + std::to_string(::getpid());
    std::filesystem::remove(kek_file);
    ASSERT_TRUE(crypto::FileKekProvider::Generate(kek_file).ok());
    kek_ = crypto::FileKekProvider::Load(kek_file).value().release();
    std::filesystem::remove(kek_file);
    claims_ = new Claims(journal_, pool_, kek_, 64);
    tenant_ = journal::CreateTenant(*journal_, "claims").value().tenant_id;
  }
  static Caller As(const std::string& principal, const std::string& role) { return {tenant_, principal, role, "ak_test"}; }
  static SubmitRequest Req(const std::string& body) { return {body, "wa-1", "notes/a.md", "agent", std::nullopt, "text/plain"}; }

  static db::Pool* pool_;
  static crypto::SigningKey* key_;
  static journal::Journal* journal_;
  static crypto::FileKekProvider* kek_;
  static Claims* claims_;
  static std::string tenant_;
};
db::Pool* ClaimsTest::pool_;
crypto::SigningKey* ClaimsTest::key_;
journal::Journal* ClaimsTest::journal_;
crypto::FileKekProvider* ClaimsTest::kek_;
Claims* ClaimsTest::claims_;
std::string ClaimsTest::tenant_;

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
