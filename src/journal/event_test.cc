#include "journal/event.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <filesystem>
#include <fstream>

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
  // The worked example in docs/data/event-catalog.md uses exactly these bytes and this hash.
  EXPECT_EQ(b->size(), 339u);
  EXPECT_EQ(crypto::Hex(crypto::Sha256(*b)), "05d97eb6ec0ca329e1ae69537828c7f4bf8ccc37b6aab2fb266e71745c1f35a2");
  auto back = Envelope::FromSignedBytes(*b);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->seq, 7);
  EXPECT_EQ(back->prev_hash, e.prev_hash);
  EXPECT_EQ(back->payload, e.payload);
  EXPECT_EQ(back->ToJson(), e.ToJson());  // every member, not only the three above
}

// docs/data/event-catalog.md "Worked event": the public test key (seed 32 x 0x01) and every value
// the catalog derives from it. Ed25519 is deterministic, so each is exact.
TEST(EnvelopeTest, WorkedEventMatchesTheCatalog) {
  const std::string path = ::testing::TempDir() + "oml-test-seed-01-" + std::to_string(getpid()) + ".pem";
  std::ofstream(path) << "-----BEGIN PRIVATE KEY-----\n"
                         "MC4CAQAwBQYDK2VwBCIEIAEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB\n"
                         "-----END PRIVATE KEY-----\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                               std::filesystem::perm_options::replace);  // key files must be 0600 to load
  auto key = crypto::SigningKey::LoadFile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_EQ(crypto::Hex(key->public_key()), "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c");
  EXPECT_EQ(crypto::Base64(key->public_key()), "iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w=");
  EXPECT_EQ(key->key_id(), "ed25519:34750f98bd59fcfc");

  auto placeholder = Sample("ed25519:0123456789abcdef").SignedBytes();
  ASSERT_TRUE(placeholder.ok());
  const std::string sig = key->Sign(*placeholder);
  EXPECT_EQ(crypto::Hex(sig),
            "8a90376e79515432537960f29d636800ebcea8f2150f11ba852c24c707040653"
            "fcdae3d9fb01f78413df62bf67d92d44b4a1bc39fca4eabe762346e18814cf0e");
  EXPECT_EQ(crypto::Base64(sig),
            "ipA3bnlRVDJTeWDynWNoAOvOqPIVDxG6hSwkxwcEBlP82uPZ+wH3hBPfYr9n2S1EtKG8Ofyk6r52I0bhiBTPDg==");

  // The catalog's end-to-end receipt: the same envelope under the key's real id.
  Receipt r = *SignEnvelope(Sample(key->key_id()), *key);
  EXPECT_EQ(r.ToJson(), nlohmann::json::parse(R"({
  "tenant": "6f1c2a0e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
  "seq": 7,
  "event_hash": "2e7751bd97f6091743b1139391e5eea46f18fb124b708e67e4c06d1ba26d0c0f",
  "prev_hash": "1111111111111111111111111111111111111111111111111111111111111111",
  "signature": "EDuy5bhWSBBJyvkXaG4fnwIC7b4GplOlKRRqlZ8HsNx5BmolOWTW+SeXzgu49y6GIrXMQ/4eaOq+6z8K4vlDDg==",
  "key_id": "ed25519:34750f98bd59fcfc",
  "signed_bytes": "eyJrZXlfaWQiOiJlZDI1NTE5OjM0NzUwZjk4YmQ1OWZjZmMiLCJwYXlsb2FkIjp7ImFydGlmYWN0X2lkIjoiMGI3ZTZhNTItOGYwYy00ZDdlLTlhNTEtM2YyYzFkMGU5YjhhIiwic2l6ZSI6NX0sInByZXYiOiIxMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExMTExIiwicHJpbmNpcGFsIjoiYWxpY2UiLCJyZWZzIjp7fSwic2VxIjo3LCJ0ZW5hbnQiOiI2ZjFjMmEwZS0zYjRkLTRlNWYtOGE5Yi0wYzFkMmUzZjRhNWIiLCJ0aW1lIjoiMjAyNi0xMS0zMFQwMjozNDowMC4xMjM0NTZaIiwidHlwZSI6ImNsYWltLnN1Ym1pdHRlZCIsInYiOjF9"
})"));
  EXPECT_TRUE(VerifyReceipt(r, key->public_key()).ok());
  // The catalog's caveat: the placeholder key id is refused with exactly this message.
  Receipt p = r;
  p.key_id = "ed25519:0123456789abcdef";
  EXPECT_EQ(VerifyReceipt(p, key->public_key()).message(),
            "receipt key_id ed25519:0123456789abcdef is not the given public key (ed25519:34750f98bd59fcfc)");
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
    r_ = *SignEnvelope(Sample(key_->key_id()), *key_);
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
  EXPECT_EQ(s.message(), "receipt key_id " + r_.key_id + " is not the given public key (" +
                             crypto::KeyIdFor(other->public_key()) + ")");
}

// ParseJsonFast (simdjson) must give what nlohmann::json::parse gives: the same value, the same
// number types (the fold and the digests read them), the same dump.
TEST(ParseJsonFastTest, EqualsNlohmannValueTypeAndDump) {
  const std::vector<std::string> docs = {
      "{}", "[]", "null", "true", "false", "0", "-0", "1", "-1", "0.5", "-0.0", "1e2", "1E-2", "1.0",
      "9223372036854775807", "-9223372036854775808", "9223372036854775808", "18446744073709551615",
      "18446744073709551616", "123456789012345678901234567890", "-9223372036854775809",
      R"("")", R"("\u00e9\ud83d\ude00\n\t\"\\\/")", "\"\xc3\xa9\xf0\x9f\x98\x80\"",
      R"({"b":1,"a":2,"c":{"z":[1,-2,3.5,"x",null,true,{}],"y":[]}})",
      R"({"a":1,"a":2})", R"({"b":1,"a":2,"b":3})", R"({"":0,"\u0000":1})",
      R"({"v":1,"tenant":"6f1c2a0e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","seq":7,"payload":{"size":5,"n":-3}})",
      "  [1, 2 ,\n3]  ", "[-0,-0.0,-0e1, -0]", R"({"a":-0})", R"({"t":"2026-01-05","n":-5,"z":-0.5})", R"([[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]])",
      "-1e-400", "1E+2", "-1.5e-3", R"("a\u0000b")", "\xEF\xBB\xBF-0", "\xEF\xBB\xBF" "1",
      std::string(1025, '[') + std::string(1025, ']'),  // deeper than simdjson's default: nlohmann's
  };
  for (const std::string& d : docs) {
    const nlohmann::json want = nlohmann::json::parse(d);
    Result<nlohmann::json> got = ParseJsonFast(d);
    ASSERT_TRUE(got.ok()) << d << ": " << got.status().ToString();
    EXPECT_EQ(got->type(), want.type()) << d;
    EXPECT_EQ(*got, want) << d;
    EXPECT_EQ(got->dump(), want.dump()) << d;
    // Every nested value's type too (== compares 1 and 1u equal).
    std::function<void(const nlohmann::json&, const nlohmann::json&)> same_types = [&](const nlohmann::json& a,
                                                                                       const nlohmann::json& b) {
      ASSERT_EQ(a.type(), b.type()) << d << " at " << a.dump();
      if (a.is_object())
        for (auto it = a.begin(); it != a.end(); ++it) same_types(it.value(), b.at(it.key()));
      if (a.is_array())
        for (size_t i = 0; i < a.size(); ++i) same_types(a[i], b[i]);
    };
    same_types(*got, want);
  }
}

TEST(ParseJsonFastTest, RefusesWhatNlohmannRefuses) {
  for (const std::string d : {"", "{", "[1,]", "{\"a\":}", "nul", "\"\xff\"", "\"\xc3\"", "01", "1.", "[1] x",
                              "{\"a\" 1}", "\"\\ud800\"x", "-05", "[-0", "{\"a\":-0",
                              "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"", "1e400", "[1e309]", "\"\x01\""}) {
    const bool nlohmann_ok = nlohmann::json::accept(d);
    Result<nlohmann::json> got = ParseJsonFast(d);
    EXPECT_EQ(got.ok(), nlohmann_ok) << d;
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), Code::kDataLoss) << d;
    }
  }
}

}  // namespace
}  // namespace oml::journal
