#include "journal/event.h"

#include <gtest/gtest.h>

#include "crypto/crypto.h"

namespace oml::journal {
namespace {

Envelope Sample(const std::string& key_id) {
  Envelope e;
  e.tenant = "6f1c2a0e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
  e.seq = 7;
  e.prev_hash = std::string(32, '\x11');
  e.type = "claim.submitted";
  e.time = "2026-11-30T02:34:00.123456Z";
  e.key_id = key_id;
  e.principal = "alice";
  e.payload = {{"artifact_id", "0b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a"}, {"size", 5}};
  return e;
}

TEST(EnvelopeTest, SignedBytesAreCanonicalAndRoundTrip) {
  Envelope e = Sample("ed25519:0123456789abcdef");
  auto b = e.SignedBytes();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b,
            R"({"key_id":"ed25519:0123456789abcdef","payload":{"artifact_id":"0b7e6a52-8f0c-4d7e-9a51-3f2c1d0e9b8a","size":5},)"
            R"("prev":"1111111111111111111111111111111111111111111111111111111111111111","principal":"alice","refs":{},)"
            R"("seq":7,"tenant":"6f1c2a0e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","time":"2026-11-30T02:34:00.123456Z",)"
            R"("type":"claim.submitted","v":1})");
  // The worked example in docs/data/event-catalog.md uses exactly these bytes.
  EXPECT_EQ(crypto::Hex(crypto::Sha256(*b)).size(), 64u);
  auto back = Envelope::FromSignedBytes(*b);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->seq, 7);
  EXPECT_EQ(back->prev_hash, e.prev_hash);
  EXPECT_EQ(back->payload, e.payload);
}

TEST(EnvelopeTest, RejectsExtraMember) {
  auto r = Envelope::FromSignedBytes(R"({"extra":1,"key_id":"k","payload":{},"prev":"00","principal":"p","refs":{},"seq":1,"tenant":"t","time":"x","type":"y","v":1})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_EQ(r.status().message(), "envelope does not have exactly the v1 members");
}

class ReceiptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto k = crypto::SigningKey::Generate();
    ASSERT_TRUE(k.ok());
    key_ = std::make_unique<crypto::SigningKey>(std::move(k).value());
    Envelope e = Sample(key_->key_id());
    r_.tenant = e.tenant;
    r_.seq = e.seq;
    r_.prev_hash = e.prev_hash;
    r_.signed_bytes = *e.SignedBytes();
    r_.event_hash = crypto::Sha256(r_.signed_bytes);
    r_.signature = key_->Sign(r_.signed_bytes);
    r_.key_id = key_->key_id();
  }
  std::unique_ptr<crypto::SigningKey> key_;
  Receipt r_;
};

TEST_F(ReceiptTest, VerifiesOfflineAfterJsonRoundTrip) {
  auto back = Receipt::FromJson(r_.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(VerifyReceipt(*back, key_->public_key()).ok());
}

TEST_F(ReceiptTest, DetectsEachTamper) {
  Receipt bad = r_;
  bad.seq = 8;
  EXPECT_EQ(VerifyReceipt(bad, key_->public_key()).message(), "receipt seq differs from the signed envelope");
  bad = r_;
  bad.signed_bytes[10] ^= 1;
  EXPECT_EQ(VerifyReceipt(bad, key_->public_key()).message(), "event_hash is not SHA-256 of signed_bytes");
  bad = r_;
  bad.signature[0] ^= 1;
  EXPECT_EQ(VerifyReceipt(bad, key_->public_key()).message(), "signature does not verify under key " + r_.key_id);
  auto other = crypto::SigningKey::Generate();
  ASSERT_TRUE(other.ok());
  Status s = VerifyReceipt(r_, other->public_key());
  EXPECT_EQ(s.code(), Code::kDataLoss);
  EXPECT_NE(s.message().find("is not the given public key"), std::string::npos);
}

}  // namespace
}  // namespace oml::journal
