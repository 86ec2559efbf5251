// The pure parts of uploads: the resumable SHA-256 and the tus header grammar.
#include <gtest/gtest.h>

#include <string>

#include "crypto/crypto.h"
#include "uploads/running_sha256.h"
#include "uploads/tus.h"
#include "uploads/uploads.h"

namespace oml::uploads {
namespace {

// NIST FIPS 180-2 vectors, and a hash carried through a state at every split point equals the
// one-shot digest.
TEST(RunningSha256Test, ResumedFromAnyStateEqualsOneShot) {
  EXPECT_EQ(crypto::Hex(RunningSha256().Digest()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  RunningSha256 abc;
  abc.Update("abc");
  EXPECT_EQ(crypto::Hex(abc.Digest()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(crypto::Hex(abc.Digest()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");  // unchanged
  const std::string data = crypto::RandomBytes(300);
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    RunningSha256 a;
    a.Update(std::string_view(data).substr(0, cut));
    const std::string st = a.State();
    ASSERT_EQ(st.size(), RunningSha256::kStateSize);
    auto b = RunningSha256::FromState(st);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->length(), cut);
    b->Update(std::string_view(data).substr(cut));
    ASSERT_EQ(b->Digest(), crypto::Sha256(data)) << cut;
  }
}

TEST(RunningSha256Test, RefusesWhatIsNotAState) {
  RunningSha256 a;
  a.Update("hello");
  std::string st = a.State();
  EXPECT_EQ(RunningSha256::FromState(st.substr(1)).status().type(), "integrity");
  EXPECT_EQ(RunningSha256::FromState(st + "x").status().type(), "integrity");
  EXPECT_EQ(RunningSha256::FromState(std::string(RunningSha256::kStateSize, '\xff')).status().code(), Code::kDataLoss);
  // The buffered count must agree with the length (5 bytes buffered).
  std::string bad = st;
  bad[104] = 6;  // SHA256_CTX::num (little-endian u32 at offset 104)
  EXPECT_EQ(RunningSha256::FromState(bad).status().code(), Code::kDataLoss);
}

TEST(TusTest, ParseUint) {
  EXPECT_EQ(tus::ParseUint("0"), 0u);
  EXPECT_EQ(tus::ParseUint("1073741824"), 1073741824u);
  EXPECT_EQ(tus::ParseUint("999999999999999999"), 999999999999999999u);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "1.0", "0x10", "1000000000000000000", "abc"})
    EXPECT_FALSE(tus::ParseUint(bad).has_value()) << bad;
}

TEST(TusTest, ParseMetadataAsTheProtocolWritesIt) {
  // The example of the tus 1.0 specification (creation extension).
  auto md = tus::ParseMetadata("filename d29ybGRfZG9taW5hdGlvbl9wbGFuLnBkZg==,is_confidential");
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(md->at("filename"), "world_domination_plan.pdf");
  EXPECT_EQ(md->at("is_confidential"), "");
  EXPECT_EQ(md->size(), 2u);
  auto spaced = tus::ParseMetadata("a YQ==, b Yg==");
  ASSERT_TRUE(spaced.ok());
  EXPECT_EQ(spaced->at("b"), "b");
  EXPECT_TRUE(tus::ParseMetadata("")->empty());
  for (const char* bad : {"a YQ==,a Yg==", "a !!!", ",a YQ==", "a YQ==,", "k\x01 YQ==", "a YQ"}) {
    auto r = tus::ParseMetadata(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().type(), "invalid-upload-metadata") << bad;
  }
  const std::map<std::string, std::string> m = {{"filename", "a b.txt"}, {"flag", ""}, {"sha256", std::string(32, '\x01')}};
  EXPECT_EQ(*tus::ParseMetadata(tus::EncodeMetadata(m)), m);
}

TEST(TusTest, CreationTakesTheDigestAsBytesOrHex) {
  const std::string raw = crypto::Sha256("file");
  auto a = tus::ParseCreation(4, {{"sha256", raw}});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->plaintext_sha256, raw);
  EXPECT_EQ(a->media_type, "application/octet-stream");
  EXPECT_EQ(a->filename, "");
  std::string upper = crypto::Hex(raw);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto b = tus::ParseCreation(4, {{"sha256", upper}, {"filename", "r\xc3\xa9sum\xc3\xa9.pdf"}, {"filetype", "application/pdf"}});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->plaintext_sha256, raw);
  EXPECT_EQ(b->filename, "r\xc3\xa9sum\xc3\xa9.pdf");
  EXPECT_EQ(b->media_type, "application/pdf");
  auto c = tus::ParseCreation(4, {{"sha256", raw}, {"content-type", "text/plain; charset=utf-8"}, {"type", "x/y"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->media_type, "text/plain; charset=utf-8");  // content-type wins over type
  const std::map<std::string, std::string> bad[] = {
      {},
      {{"sha256", raw.substr(1)}},
      {{"sha256", std::string(64, 'g')}},
      {{"sha256", raw}, {"filename", "a\nb"}},
      {{"sha256", raw}, {"filename", std::string(256, 'a')}},
      {{"sha256", raw}, {"filename", "\xc3"}},
      {{"sha256", raw}, {"content-type", "pdf"}},
      {{"sha256", raw}, {"content-type", "text/plain\x7f"}},
  };
  for (const auto& m : bad) EXPECT_EQ(tus::ParseCreation(4, m).status().type(), "invalid-upload-metadata");
  EXPECT_TRUE(tus::ParseCreation(4, {{"sha256", raw}, {"filename", std::string(255, 'a')}}).ok());
}

TEST(TusTest, ParseChecksum) {
  auto s = tus::ParseChecksum("sha1 " + crypto::Base64(std::string(20, 'a')));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->algorithm, ChecksumAlgorithm::kSha1);
  EXPECT_EQ(s->digest, std::string(20, 'a'));
  auto t = tus::ParseChecksum("sha256 " + crypto::Base64(std::string(32, 'b')));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->algorithm, ChecksumAlgorithm::kSha256);
  EXPECT_EQ(tus::ParseChecksum("md5 " + crypto::Base64(std::string(16, 'c'))).status().type(),
            "unsupported-checksum-algorithm");
  EXPECT_EQ(tus::ParseChecksum("sha256 " + crypto::Base64(std::string(20, 'b'))).status().type(), "invalid-upload-checksum");
  EXPECT_EQ(tus::ParseChecksum("sha256").status().type(), "invalid-upload-checksum");
  EXPECT_EQ(tus::ParseChecksum("sha256 ***").status().type(), "invalid-upload-checksum");
}

TEST(TusTest, HttpDate) {
  EXPECT_EQ(tus::HttpDate(0), "Thu, 01 Jan 1970 00:00:00 GMT");
  EXPECT_EQ(tus::HttpDate(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");  // RFC 9110's example
}

TEST(NamingTest, KeysAndAads) {
  const std::string t = "11111111-1111-4111-8111-111111111111", u = "22222222-2222-4222-8222-222222222222";
  EXPECT_EQ(UploadDekAad(t, u), "oml-upload-dek|" + t + "|" + u);
  EXPECT_EQ(AttachmentAad(t, u), "oml-attachment|" + t + "|" + u);
  EXPECT_EQ(StreamAad(t, u, 7), "oml-upload-stream|" + t + "|" + u + "|7");
  EXPECT_EQ(ShaStateAad(t, u, 7), "oml-upload-sha|" + t + "|" + u + "|7");
  EXPECT_EQ(PartKey(t, u, 3), t + "/uploads/" + u + "/00000003");
  EXPECT_EQ(PartPrefix(t, u), t + "/uploads/" + u + "/");
  std::string ab;
  for (int i = 0; i < 32; ++i) ab += "ab";
  EXPECT_EQ(ObjectKey(t, std::string(32, '\xab')), t + "/" + ab);
}

// The stream state round-trips through its encoding, and StreamPositionMatches accepts exactly
// the state an encryptor stands in after n bytes, whatever the chunking.
TEST(StreamStateTest, EncodingAndPosition) {
  const std::string dek = crypto::RandomBytes(32);
  auto enc = crypto::AeadStreamEncryptor::Create(dek, "aad", 16);
  ASSERT_TRUE(enc.ok());
  uint64_t off = 0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{1}, size_t{40}, size_t{16}}) {
    if (n > 0) {
      ASSERT_TRUE((*enc)->Update(std::string(n, 'p')).ok());
      off += n;
    }
    auto st = (*enc)->Suspend();
    ASSERT_TRUE(st.ok());
    EXPECT_TRUE(StreamPositionMatches(*st, off)) << off;
    EXPECT_FALSE(StreamPositionMatches(*st, off + 1)) << off;
    if (off > 0) {
      EXPECT_FALSE(StreamPositionMatches(*st, off - 1)) << off;
    }
    std::string bytes = EncodeStreamState(*st);
    EXPECT_EQ(bytes.size(), 21 + st->pending.size());
    auto back = DecodeStreamState(bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->segment_size, 16u);
    EXPECT_EQ(back->nonce_prefix, st->nonce_prefix);
    EXPECT_EQ(back->next_segment, st->next_segment);
    EXPECT_EQ(back->header_sent, st->header_sent);
    EXPECT_EQ(back->pending.view(), st->pending.view());
    // Rewound: one segment back, or the header flag off, never matches.
    if (st->next_segment > 0) {
      crypto::AeadEncryptorState rewound = std::move(back).value();
      --rewound.next_segment;
      EXPECT_FALSE(StreamPositionMatches(rewound, off));
    }
    // Malformed: truncated, another version, a bad flag, pending longer than a segment.
    EXPECT_EQ(DecodeStreamState(bytes.substr(0, 20)).status().type(), "integrity");
    std::string v2 = bytes;
    v2[0] = 2;
    EXPECT_EQ(DecodeStreamState(v2).status().type(), "integrity");
    std::string flag = bytes;
    flag[20] = 7;
    EXPECT_EQ(DecodeStreamState(flag).status().type(), "integrity");
    EXPECT_EQ(DecodeStreamState(bytes.substr(0, 21) + std::string(17, 'x')).status().type(), "integrity");
  }
  EXPECT_EQ(off, 89u);
}

}  // namespace
}  // namespace oml::uploads
