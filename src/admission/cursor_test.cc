// Recall cursors (admission/cursor.h) without a database: round trips, the forgeries a client can
// make (the v1 format's unkeyed SHA-256 check recomputed, another secret, an unknown key id, any
// flipped bit), key rotation, and the checks of an authentic but malformed doc.
#include "admission/cursor.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

namespace oml::admission {
namespace {

using nlohmann::json;

// A ring from "<id> <hex>" lines; fails the test if they do not parse.
crypto::HmacKeyRing Ring(const std::string& text) {
  auto r = crypto::HmacKeyRing::Parse(text, "test ring");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) std::abort();
  return std::move(r).value();
}

const std::string kSecretA(64, 'a'), kSecretB(64, 'b'), kSecretC(64, 'c');
const std::string kBinding = "0123456789abcdef";
const CursorPosition kPos{42, "0a1b2c3d-0000-4000-8000-00000000abcd", ""};
const CursorPosition kRanked{7, "ffffffff-1111-4222-8333-444444444444", "0.0607927"};

std::string Base64Url(std::string_view raw) {
  std::string s = crypto::Base64(raw);
  while (!s.empty() && s.back() == '=') s.pop_back();
  for (char& ch : s) ch = ch == '+' ? '-' : ch == '/' ? '_' : ch;
  return s;
}
std::string FromBase64Url(std::string s) {
  for (char& ch : s) ch = ch == '-' ? '+' : ch == '_' ? '/' : ch;
  while (s.size() % 4) s.push_back('=');
  auto r = crypto::FromBase64(s);
  EXPECT_TRUE(r.ok()) << s;
  return r.ok() ? *r : "";
}

class CursorTest : public ::testing::Test {
 protected:
  crypto::HmacKeyRing ring_ = Ring("k1 " + kSecretA + "\n");

  // Expects `cursor` refused with invalid-cursor and exactly `message`.
  static void Refused(const crypto::HmacKeyRing& ring, const std::string& cursor, const std::string& message,
                      bool search = false, const std::string& binding = kBinding) {
    auto r = DecodeCursor(ring, cursor, binding, search);
    ASSERT_FALSE(r.ok()) << cursor;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << cursor;
    EXPECT_EQ(r.status().type(), "invalid-cursor") << cursor;
    EXPECT_EQ(r.status().message(), message) << cursor;
  }
  void Refused(const std::string& cursor, const std::string& message, bool search = false) {
    Refused(ring_, cursor, message, search);
  }
  // Expects `cursor` accepted as `want`.
  static void Accepted(const crypto::HmacKeyRing& ring, const std::string& cursor, const CursorPosition& want,
                       bool search = false) {
    auto r = DecodeCursor(ring, cursor, kBinding, search);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->seq, want.seq);
    EXPECT_EQ((*r)->artifact_id, want.artifact_id);
    EXPECT_EQ((*r)->rank, want.rank);
  }

  // The raw bytes of a v2 cursor: 0x02, id_len, id, doc, tag (cursor.h).
  struct Parts {
    std::string id, doc, tag;
  };
  static Parts Split(const std::string& cursor) {
    const std::string raw = FromBase64Url(cursor);
    const size_t n = static_cast<uint8_t>(raw[1]);
    return {raw.substr(2, n), raw.substr(2 + n, raw.size() - 2 - n - 32), raw.substr(raw.size() - 32)};
  }
  static std::string Header(const std::string& id) { return std::string(1, '\x02') + char(id.size()) + id; }
  // A v2 cursor whose tag is made by `tag_of` over the MAC input (domain, NUL, header, doc).
  template <typename TagFn>
  static std::string Make(const std::string& id, const std::string& doc, TagFn tag_of) {
    const std::string signed_bytes = Header(id) + doc;
    return Base64Url(signed_bytes + tag_of(std::string("oml-cursor/v2") + '\0' + signed_bytes));
  }
  // As the server would MAC it, under `secret_hex`.
  static std::string Signed(const std::string& id, const std::string& secret_hex, const std::string& doc) {
    return Make(id, doc, [&](const std::string& in) { return crypto::HmacSha256(*crypto::FromHex(secret_hex), in); });
  }
  static std::string Doc(int64_t seq, const std::string& artifact, const std::string& binding = kBinding) {
    return json{{"v", 2}, {"q", binding}, {"s", seq}, {"a", artifact}}.dump();
  }
};

TEST_F(CursorTest, RoundTripsListAndSearchPositions) {
  Accepted(ring_, EncodeCursor(ring_, kBinding, kPos, false), kPos);
  Accepted(ring_, EncodeCursor(ring_, kBinding, kRanked, true), kRanked, true);
  auto first = DecodeCursor(ring_, "", kBinding, false);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->has_value());
  // The layout of cursor.h, exactly: header, the doc, HMAC-SHA-256 under k1's secret.
  const std::string c = EncodeCursor(ring_, kBinding, kPos, false);
  const Parts p = Split(c);
  EXPECT_EQ(FromBase64Url(c).substr(0, 4), std::string("\x02\x02k1", 4));
  EXPECT_EQ(p.id, "k1");
  EXPECT_EQ(p.doc, R"({"a":"0a1b2c3d-0000-4000-8000-00000000abcd","q":"0123456789abcdef","s":42,"v":2})");
  EXPECT_EQ(c, Signed("k1", kSecretA, p.doc));
  EXPECT_LE(EncodeCursor(ring_, kBinding, {INT64_MAX, kPos.artifact_id, std::string(40, '9')}, true).size(), 300u);
}

// The review's forgery of the v1 format: base64url(doc || SHA-256("oml-cursor/v1" NUL doc)[0..8))
// with a position of the forger's choosing. It was accepted before cursors were MACed.
TEST_F(CursorTest, TheV1UnkeyedSha256ForgeryIsRefused) {
  const std::string doc = json{{"v", 1}, {"q", kBinding}, {"s", 1000000}, {"a", kPos.artifact_id}}.dump();
  const std::string v1 = Base64Url(doc + crypto::Sha256(std::string("oml-cursor/v1") + '\0' + doc).substr(0, 8));
  Refused(v1, "cursor is not one this server issued (unknown format)");
}

// The same forgery on the v2 layout: a real cursor's doc changed and its tag recomputed without
// the secret, as an unkeyed SHA-256 (whole or cut to 8 bytes as v1 did), or as an HMAC under
// another secret. Each is refused as altered.
TEST_F(CursorTest, RecomputedUnkeyedChecksAndOtherSecretsAreRefused) {
  const Parts real = Split(EncodeCursor(ring_, kBinding, kPos, false));
  const std::string forged_doc = Doc(1000000, kPos.artifact_id);
  ASSERT_NE(forged_doc, real.doc);
  Refused(Make("k1", forged_doc, [](const std::string& in) { return crypto::Sha256(in); }), "cursor was altered");
  Refused(Make("k1", forged_doc, [](const std::string& in) { return crypto::Sha256(in).substr(0, 8); }),
          "cursor was altered");
  // Under another secret, the doc unchanged or changed: the same key id does not make it ours.
  Refused(Signed("k1", kSecretB, real.doc), "cursor was altered");
  Refused(Signed("k1", kSecretB, forged_doc), "cursor was altered");
  // A cursor MACed by another deployment (another ring, same id) is refused too.
  const crypto::HmacKeyRing other = Ring("k1 " + kSecretB + "\n");
  Refused(EncodeCursor(other, kBinding, kPos, false), "cursor was altered");
  // The real key and a real tag, moved onto another doc.
  Refused(Base64Url(Header("k1") + forged_doc + real.tag), "cursor was altered");
}

TEST_F(CursorTest, UnknownKeyIdsAreRefused) {
  const std::string doc = Doc(5, kPos.artifact_id);
  Refused(Signed("k9", kSecretA, doc), "cursor was issued under a key this server does not hold");
  Refused(Signed("K1", kSecretA, doc), "cursor was issued under a key this server does not hold");
  Refused(Signed(std::string(32, 'k'), kSecretA, doc), "cursor was issued under a key this server does not hold");
  // An empty id, and an id length running past the end.
  Refused(Base64Url(std::string("\x02\x00", 2) + doc + std::string(32, 't')),
          "cursor is not one this server issued (truncated)");
  Refused(Base64Url(std::string("\x02\xff", 2) + "k1" + std::string(32, 't')),
          "cursor is not one this server issued (truncated)");
}

// Rotation: the new key first, the old one kept below it. Cursors issued before the rotation
// still page; new ones are MACed under the new key; once the old key is removed, its cursors are
// refused by key id.
TEST_F(CursorTest, RotationKeepsCursorsOfThePreviousSecret) {
  const std::string before = EncodeCursor(ring_, kBinding, kPos, false);
  const crypto::HmacKeyRing rotated = Ring("k2 " + kSecretC + "\nk1 " + kSecretA + "\n");
  Accepted(rotated, before, kPos);
  const std::string after = EncodeCursor(rotated, kBinding, kPos, false);
  EXPECT_EQ(Split(after).id, "k2");
  EXPECT_EQ(after, Signed("k2", kSecretC, Split(after).doc));
  Accepted(rotated, after, kPos);
  // A replica not yet restarted (old ring only) refuses the new key's cursors by id: why every
  // replica gets the new file (second line included) before the old key is dropped.
  Refused(ring_, after, "cursor was issued under a key this server does not hold");
  const crypto::HmacKeyRing retired = Ring("k2 " + kSecretC + "\n");
  Refused(retired, before, "cursor was issued under a key this server does not hold");
  Accepted(retired, after, kPos);
}

// Every bit of the raw cursor flipped, one at a time, and every character of the text replaced:
// each is refused (the tag covers the header and the doc; the tag itself is compared whole).
TEST_F(CursorTest, AnyFlippedBitOrChangedCharacterIsRefused) {
  for (bool search : {false, true}) {
    const std::string cursor = EncodeCursor(ring_, kBinding, search ? kRanked : kPos, search);
    const std::string raw = FromBase64Url(cursor);
    for (size_t i = 0; i < raw.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string t = raw;
        t[i] = static_cast<char>(t[i] ^ (1 << bit));
        auto r = DecodeCursor(ring_, Base64Url(t), kBinding, search);
        ASSERT_FALSE(r.ok()) << "byte " << i << " bit " << bit;
        EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
        EXPECT_EQ(r.status().type(), "invalid-cursor");
      }
    }
    static const std::string kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=. ";
    for (size_t i = 0; i < cursor.size(); ++i) {
      for (char c : kAlphabet) {
        if (c == cursor[i]) continue;
        std::string t = cursor;
        t[i] = c;
        auto r = DecodeCursor(ring_, t, kBinding, search);
        ASSERT_FALSE(r.ok()) << "char " << i << " -> " << c;
        EXPECT_EQ(r.status().type(), "invalid-cursor");
      }
    }
    // Cut or extended (which message depends on where the base64 groups end).
    for (const std::string& t : {cursor.substr(0, cursor.size() - 1), cursor.substr(0, cursor.size() - 2),
                                 cursor + "A", cursor + "AA", cursor + "AAA", cursor + "AAAA"}) {
      auto r = DecodeCursor(ring_, t, kBinding, search);
      ASSERT_FALSE(r.ok()) << t;
      EXPECT_EQ(r.status().type(), "invalid-cursor");
    }
  }
}

TEST_F(CursorTest, BoundToItsQueryAndEndpoint) {
  const std::string list = EncodeCursor(ring_, kBinding, kPos, false);
  Refused(ring_, list, "cursor belongs to another query (other filters, search text or endpoint)", false,
          "fedcba9876543210");
  // A list cursor given to search, and a search cursor given to list: the doc's shape differs.
  Refused(list, "cursor is not one this server issued", true);
  Refused(EncodeCursor(ring_, kBinding, kRanked, true), "cursor is not one this server issued", false);
}

// Docs that carry a valid tag but were never made by EncodeCursor (only the secret's holder can
// make them): refused all the same.
TEST_F(CursorTest, AuthenticButMalformedDocsAreRefused) {
  const std::string issued = "cursor is not one this server issued";
  auto signed_doc = [&](const json& doc) { return Signed("k1", kSecretA, doc.dump()); };
  const json good = {{"v", 2}, {"q", kBinding}, {"s", 5}, {"a", kPos.artifact_id}};
  Accepted(ring_, signed_doc(good), {5, kPos.artifact_id, ""});
  json j = good;
  j["v"] = 1;
  Refused(signed_doc(j), issued);
  j = good;
  j["s"] = 0;
  Refused(signed_doc(j), issued);
  j = good;
  j["s"] = "5";
  Refused(signed_doc(j), issued);
  j = good;
  j["a"] = "0A1B2C3D-0000-4000-8000-00000000ABCD";
  Refused(signed_doc(j), issued);
  j = good;
  j["x"] = 1;
  Refused(signed_doc(j), issued);
  Refused(Signed("k1", kSecretA, "not json"), issued);
  for (const char* rank : {"", "nan", "inf", "1e999", "0.5x", "0x10"}) {
    j = good;
    j["r"] = rank;
    Refused(ring_, signed_doc(j), issued, true);
  }
  j = good;
  j["r"] = std::string(41, '1');
  Refused(ring_, signed_doc(j), issued, true);
}

TEST_F(CursorTest, EncodingIsCanonicalAndBounded) {
  Refused(std::string(kMaxCursorChars + 1, 'A'), "cursor is not one this server issued (too long)");
  for (const char* bad : {"!!!", "e30=", "e30", "a+b/", "A", "AB CD"}) {
    auto r = DecodeCursor(ring_, bad, kBinding, false);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().type(), "invalid-cursor") << bad;
  }
  // The same bytes spelled with non-zero unused bits in the last character: a cursor whose
  // length is not a multiple of 4 characters has such bits (seq 42 gives one, checked).
  const std::string cursor = EncodeCursor(ring_, kBinding, kPos, false);
  ASSERT_NE(cursor.size() % 4, 0u);
  Accepted(ring_, cursor, kPos);
  std::string t = cursor;
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  t.back() = alphabet[alphabet.find(t.back()) | 1];
  ASSERT_NE(t, cursor);
  Refused(t, "cursor is not base64url of a cursor");
}

}  // namespace
}  // namespace oml::admission
