#include "review/review.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "crypto/crypto.h"
#include "review/clamd_testing.h"
#include "review/extract.h"
#include "review/media_type.h"
#include "review/pdf_testing.h"
#include "review/test_bytes_testing.h"

namespace oml::review {

inline void PrintTo(const DenyHit& h, std::ostream* os) { *os << "{" << h.pattern_id << ", " << h.offset << "}"; }

namespace {

const std::string kAwsKeyId = "AKIAIOSFODNN7EXAMPLE";

Review Must(const Options& o, std::string_view declared, std::string_view bytes) {
  auto r = ReviewContent(o, declared, bytes);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : Review{};
}

TEST(ReviewContentTest, PlainTextIsExtractedNormalizedAndGated) {
  Review r = Must({}, "text/plain; charset=utf-8", "hello world\r\nkey " + kAwsKeyId + "\r\n");
  EXPECT_EQ(r.declared_media_type, "text/plain");
  EXPECT_EQ(r.detected_media_type, "text/plain");
  EXPECT_EQ(r.media_type, "text/plain");
  EXPECT_FALSE(r.media_type_mismatch);
  EXPECT_EQ(r.charset, "us-ascii");
  EXPECT_EQ(r.kind, ReviewKind::kTextExtraction);
  EXPECT_EQ(r.method, "text");
  EXPECT_EQ(r.text, "hello world\nkey " + kAwsKeyId + "\n");
  // The offset is into the extracted text (CR LF became LF): 12 + 4, not 13 + 4.
  EXPECT_EQ(r.hits, (std::vector<DenyHit>{{"aws-access-key-id", 16}}));
  EXPECT_EQ(r.scan.ToString(), "not-configured");
  EXPECT_EQ(r.Flags(), (std::vector<std::string>{"deny-list"}));
}

TEST(ReviewContentTest, DigestAndSizeOfTheBytesAsGiven) {
  Review r = Must({}, "", "hello world\n");
  EXPECT_EQ(r.sha256_hex, "a948904f2f0f479b8f8197694b30184b0d2ed1c1cd2a1ec0fb85d299a192a447");
  EXPECT_EQ(r.size, 12u);
  EXPECT_TRUE(r.Flags().empty());
}

TEST(ReviewContentTest, MarkdownIsTextUnderItsDeclaredType) {
  Review r = Must({}, "text/markdown", "# Title\n\nSome *text*.\n");
  EXPECT_EQ(r.detected_media_type, "text/plain");
  EXPECT_EQ(r.media_type, "text/markdown");
  EXPECT_FALSE(r.media_type_mismatch);
  EXPECT_EQ(r.method, "text");
  EXPECT_EQ(r.text, "# Title\n\nSome *text*.\n");
}

TEST(ReviewContentTest, JsonGivesKeysAndStringsAndHitsInThatText) {
  const std::string json = R"({"name": "ci", "env": {"AWS_ACCESS_KEY_ID": "\u0041KIAIOSFODNN7EXAMPLE", "n": 3}})";
  Review r = Must({}, "application/json", json);
  EXPECT_EQ(r.detected_media_type, "application/json");
  EXPECT_EQ(r.method, "json");
  EXPECT_EQ(r.text, "name\nci\nenv\nAWS_ACCESS_KEY_ID\n" + kAwsKeyId + "\nn\n");
  EXPECT_EQ(r.hits, (std::vector<DenyHit>{{"aws-access-key-id", 30}}));  // found only once unescaped
}

TEST(ReviewContentTest, InvalidJsonDeclaredAsJsonIsReviewedAsTextAndSaysSo) {
  // libmagic's own JSON check is lenient (it accepts the trailing comma), so invalid JSON may be
  // detected as JSON or as plain text; either way the JSON parser decides.
  for (const auto& [broken, detected] :
       {std::pair<std::string, std::string>{"{\"token\": \"ghp_0123456789abcdefghijklmnopqrstuvwxyz\",}\n", "application/json"},
        {"{token: \"ghp_0123456789abcdefghijklmnopqrstuvwxyz\"}\n", "text/plain"}}) {
    Review r = Must({}, "application/json", broken);
    EXPECT_EQ(r.detected_media_type, detected);
    EXPECT_EQ(r.media_type, "application/json");
    EXPECT_FALSE(r.media_type_mismatch);
    EXPECT_EQ(r.kind, ReviewKind::kTextExtraction);
    EXPECT_EQ(r.method, "json-invalid-as-text");
    EXPECT_EQ(r.text, broken);
    EXPECT_EQ(r.hits, (std::vector<DenyHit>{{"github-token", broken[1] == '"' ? 11u : 9u}})) << broken;
  }
}

// Issue 9, "Extraction": a real PDF with a secret pattern is caught.
TEST(ReviewContentTest, PdfTextIsExtractedAndTheSecretInItCaught) {
  const std::string pdf = testing::MakePdf({{"Quarterly notes", "nothing here"}, {"deploy with " + kAwsKeyId}});
  Review r = Must({}, "application/pdf", pdf);
  EXPECT_EQ(r.detected_media_type, "application/pdf");
  EXPECT_EQ(r.kind, ReviewKind::kTextExtraction);
  EXPECT_EQ(r.method, "pdf");
  EXPECT_EQ(r.pdf_pages, 2);
  EXPECT_EQ(r.charset, "");
  EXPECT_EQ(r.text, "Quarterly notes\nnothing here\n\n\fdeploy with " + kAwsKeyId + "\n\n\f");
  EXPECT_EQ(r.hits, (std::vector<DenyHit>{{"aws-access-key-id", 43}}));
  EXPECT_EQ(r.Flags(), (std::vector<std::string>{"deny-list"}));
}

TEST(ReviewContentTest, EncryptedAndCorruptPdfsAreOpaqueWithAClearMethod) {
  Review enc = Must({}, "application/pdf", testing::MakePdf({{kAwsKeyId}}, /*encrypt=*/true));
  EXPECT_EQ(enc.kind, ReviewKind::kOpaque);
  EXPECT_EQ(enc.method, "pdf-encrypted");
  EXPECT_EQ(enc.text, "");
  EXPECT_TRUE(enc.hits.empty());
  EXPECT_EQ(enc.Flags(), (std::vector<std::string>{"not-extracted"}));

  Review bad = Must({}, "application/pdf", "%PDF-1.7\n1 0 obj << /Type /Catalog >>\ntruncated");
  EXPECT_EQ(bad.kind, ReviewKind::kOpaque);
  EXPECT_EQ(bad.method, "pdf-unreadable");
  EXPECT_EQ(bad.Flags(), (std::vector<std::string>{"not-extracted"}));
}

TEST(ReviewContentTest, BinariesAreOpaque) {
  for (const auto& [bytes, type] : {std::pair{testing::OnePixelPng(), "image/png"},
                                    std::pair{testing::EmptyZip(), "application/zip"}}) {
    Review r = Must({}, type, bytes);
    EXPECT_EQ(r.detected_media_type, type);
    EXPECT_EQ(r.kind, ReviewKind::kOpaque);
    EXPECT_EQ(r.method, "binary");
    EXPECT_EQ(r.text, "");
    EXPECT_TRUE(r.hits.empty());
    EXPECT_FALSE(r.media_type_mismatch);
    EXPECT_EQ(r.size, bytes.size());
  }
}

TEST(ReviewContentTest, TheBytesDecideWhenTheDeclarationDisagrees) {
  // A PNG declared as text: opaque, flagged as a mismatch.
  Review png = Must({}, "text/plain", testing::OnePixelPng());
  EXPECT_EQ(png.media_type, "image/png");
  EXPECT_TRUE(png.media_type_mismatch);
  EXPECT_EQ(png.kind, ReviewKind::kOpaque);
  EXPECT_EQ(png.Flags(), (std::vector<std::string>{"media-type-mismatch"}));
  // Text declared as an image: extracted and gated all the same.
  Review txt = Must({}, "image/png", "not an image " + kAwsKeyId);
  EXPECT_EQ(txt.media_type, "text/plain");
  EXPECT_TRUE(txt.media_type_mismatch);
  EXPECT_EQ(txt.method, "text");
  EXPECT_EQ(txt.hits, (std::vector<DenyHit>{{"aws-access-key-id", 13}}));
  EXPECT_EQ(txt.Flags(), (std::vector<std::string>{"deny-list", "media-type-mismatch"}));
  // A PDF declared as octet-stream: nothing was claimed, no mismatch.
  Review pdf = Must({}, "application/octet-stream", testing::MakePdf({{"x"}}));
  EXPECT_EQ(pdf.method, "pdf");
  EXPECT_FALSE(pdf.media_type_mismatch);
}

TEST(ReviewContentTest, EmptyBytes) {
  Review r = Must({}, "text/plain", "");
  EXPECT_EQ(r.kind, ReviewKind::kTextExtraction);
  EXPECT_EQ(r.method, "empty");
  EXPECT_EQ(r.text, "");
  EXPECT_FALSE(r.media_type_mismatch);
  EXPECT_EQ(r.sha256_hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(ReviewContentTest, SameBytesSameReview) {
  const std::string pdf = testing::MakePdf({{"a " + kAwsKeyId}, {"b"}});
  for (const auto& [type, bytes] : {std::pair<std::string, std::string>{"application/pdf", pdf},
                                    {"text/plain", "x\r\ny " + kAwsKeyId},
                                    {"application/json", R"({"k": ["v", "w"]})"}}) {
    Review a = Must({}, type, bytes), b = Must({}, type, bytes);
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(ReviewToJson(a).dump(), ReviewToJson(b).dump());
  }
}

TEST(ReviewContentTest, TheCapCutsTheKeptTextButTheDenyListScansAllOfIt) {
  Options o;
  o.max_text_bytes = 16;
  Review r = Must(o, "text/plain", "0123456789abcdef " + kAwsKeyId);
  EXPECT_EQ(r.text, "0123456789abcdef");
  EXPECT_TRUE(r.text_kept_truncated);
  EXPECT_EQ(r.text_bytes, 17 + kAwsKeyId.size());
  EXPECT_FALSE(r.text_truncated);
  EXPECT_EQ(r.hits, (std::vector<DenyHit>{{"aws-access-key-id", 17}}));
  EXPECT_TRUE(r.notes.empty());
  EXPECT_EQ(r.Flags(), (std::vector<std::string>{"deny-list"}));
  EXPECT_EQ(ReviewToJson(r)["text_bytes"], 37);
}

// A source that gives `bytes` in pieces of the given sizes (cycled), counting restarts; it can
// fail at a byte offset or give fewer bytes than it has.
class PieceSource : public ByteSource {
 public:
  PieceSource(std::string bytes, std::vector<size_t> sizes) : bytes_(std::move(bytes)), sizes_(std::move(sizes)) {}
  Result<std::string_view> Next() override {
    if (fail_at_ && at_ >= *fail_at_) return Unavailable("the store went away", "store-unavailable");
    const size_t want = sizes_[turn_++ % sizes_.size()];
    const size_t n = std::min(want, bytes_.size() - at_);
    piece_ = bytes_.substr(at_, n);  // a copy: the view must not outlive the call's promise
    at_ += n;
    return std::string_view(piece_);
  }
  Status Restart() override {
    ++restarts_;
    at_ = 0;
    return Status::Ok();
  }
  int restarts() const { return restarts_; }
  size_t at() const { return at_; }
  std::optional<size_t> fail_at_;

 private:
  std::string bytes_, piece_;
  std::vector<size_t> sizes_;
  size_t at_ = 0, turn_ = 0;
  int restarts_ = 0;
};

Review MustStream(const Options& o, std::string_view declared, const std::string& bytes, std::vector<size_t> sizes,
                  int* restarts = nullptr) {
  PieceSource src(bytes, std::move(sizes));
  auto r = ReviewStream(o, declared, bytes.size(), &src);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (restarts) *restarts = src.restarts();
  return r.ok() ? std::move(r).value() : Review{};
}

TEST(ReviewStreamTest, PiecesOfAnySizeGiveTheWholeReview) {
  const std::string pdf = testing::MakePdf({{"a " + kAwsKeyId}, {"b"}});
  std::string utf16 = "\xFF\xFE";
  for (char c : std::string(R"({"k\u00e9y": ")") + kAwsKeyId + "\"}") {
    utf16.push_back(c);
    utf16.push_back('\0');
  }
  const std::vector<std::pair<std::string, std::string>> items = {
      {"application/pdf", pdf},
      {"text/plain", "x\r\ny " + kAwsKeyId + "\r\n\xC3\xA9t\xC3\xA9 \xF0\x9F\x98\x80 \xC3"},
      {"text/plain", "\xEF\xBB\xBFbom then " + kAwsKeyId},
      {"application/json", R"({"k": ["v", ")" + kAwsKeyId + R"("], "n": 1})"},
      {"application/json", R"({"k": "v", )" + kAwsKeyId},  // not JSON: reviewed again as text
      {"application/json", utf16},
      {"image/png", testing::OnePixelPng()},
      {"", ""},
  };
  for (const auto& [type, bytes] : items) {
    const Review whole = Must({}, type, bytes);
    for (const std::vector<size_t>& sizes :
         {std::vector<size_t>{1}, std::vector<size_t>{2}, std::vector<size_t>{3, 1, 7}, std::vector<size_t>{64}}) {
      int restarts = 0;
      const Review r = MustStream({}, type, bytes, sizes, &restarts);
      SCOPED_TRACE(type + " in pieces of " + std::to_string(sizes[0]));
      EXPECT_EQ(r.text, whole.text);
      EXPECT_EQ(ReviewToJson(r).dump(), ReviewToJson(whole).dump());
      EXPECT_EQ(restarts, whole.method == "json-invalid-as-text" ? 1 : 0);
    }
  }
  // The cases above do what they say.
  EXPECT_EQ(Must({}, "application/json", R"({"k": "v", )" + kAwsKeyId).method, "json-invalid-as-text");
  EXPECT_EQ(Must({}, "application/json", utf16).method, "json");
  EXPECT_EQ(Must({}, "application/json", utf16).hits, (std::vector<DenyHit>{{"aws-access-key-id", 5}}));  // "k\u00e9y\n"
  EXPECT_EQ(Must({}, "application/pdf", pdf).method, "pdf");
}

TEST(ReviewStreamTest, ASecretPastTheSixtyFourMiBMarkIsFoundAndClamdGetsEveryByte) {
  // 70 MiB of text in 8 MiB pieces (the object store's ranges), the key past 64 MiB and one
  // across a piece boundary.
  std::string text(size_t{70} << 20, 'a');
  for (size_t i = 99; i < text.size(); i += 100) text[i] = '\n';
  const size_t late = (size_t{64} << 20) + 12345, seam = (size_t{16} << 20) - 7;
  for (size_t at : {late, seam}) {
    text.replace(at, kAwsKeyId.size(), kAwsKeyId);
    text[at - 1] = ' ';
    text[at + kAwsKeyId.size()] = ' ';
  }
  testing::FakeClamd clean(testing::FakeClamd::Mode::kClean);
  Options o;
  o.clamd_address = clean.address();
  const Review r = MustStream(o, "text/plain", text, {size_t{8} << 20});
  EXPECT_EQ(r.method, "text");
  EXPECT_EQ(r.hits, (std::vector<DenyHit>{{"aws-access-key-id", seam}, {"aws-access-key-id", late}}));
  EXPECT_EQ(r.text_bytes, text.size());
  EXPECT_EQ(r.text.size(), o.max_text_bytes);  // the kept prefix, for the index
  EXPECT_TRUE(r.text_kept_truncated);
  EXPECT_FALSE(r.text_truncated);
  EXPECT_EQ(r.Flags(), (std::vector<std::string>{"deny-list"}));
  EXPECT_EQ(r.size, text.size());
  EXPECT_EQ(r.sha256_hex, crypto::Hex(crypto::Sha256(text)));
  EXPECT_EQ(r.scan.ToString(), "clean");
  ASSERT_EQ(clean.sessions().size(), 1u);
  EXPECT_EQ(clean.sessions()[0].data.size(), text.size());
  EXPECT_TRUE(clean.sessions()[0].data == text);
}

TEST(ReviewStreamTest, ALargeJsonIsParsedInPiecesAndScannedWhole) {
  std::string json = "[";
  for (int i = 0; i < 400000; ++i) json += R"({"n": )" + std::to_string(i) + R"(, "s": "value number )" + std::to_string(i) + "\"},";
  json += R"({"key": ")" + kAwsKeyId + "\"}]";
  const Review r = MustStream({}, "application/json", json, {65536, 3});
  EXPECT_EQ(r.method, "json");
  ASSERT_EQ(r.hits.size(), 1u);
  EXPECT_EQ(r.hits[0].pattern_id, "aws-access-key-id");
  EXPECT_EQ(r.hits[0].offset, r.text_bytes - kAwsKeyId.size() - 1);
  EXPECT_GT(r.text_bytes, size_t{8} << 20);
}

TEST(ReviewStreamTest, TheSourcesErrorEndsTheReviewAndAShortSourceIsIntegrity) {
  PieceSource failing(std::string(1 << 20, 'x'), {4096});
  failing.fail_at_ = 300000;
  auto r = ReviewStream({}, "text/plain", 1 << 20, &failing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().type(), "store-unavailable");

  PieceSource shorter("hello", {2});
  auto s = ReviewStream({}, "text/plain", 6, &shorter);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kDataLoss);
  EXPECT_EQ(s.status().type(), "integrity");
}

TEST(ReviewStreamTest, ExtractTextStopsOnceTheKeptTextIsFull) {
  Options o;
  o.max_text_bytes = 1000;
  const std::string text(size_t{32} << 20, 'b');
  PieceSource src(text, {size_t{1} << 20});
  auto r = ExtractTextStream(o, "text/plain", text.size(), &src, "text");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->text, std::string(1000, 'b'));
  EXPECT_EQ(r->text, Must(o, "text/plain", text).text);
  // Read: the detection prefix and one piece after it, not the 32 MiB.
  auto bytes_max = MediaTypeBytesMax();
  ASSERT_TRUE(bytes_max.ok());
  EXPECT_LE(src.at(), *bytes_max + (size_t{1} << 20));
  EXPECT_LT(src.at(), text.size());
}

TEST(ReviewContentTest, ClamdScansEveryKindWhenConfigured) {
  testing::FakeClamd found(testing::FakeClamd::Mode::kFound);
  Options o;
  o.clamd_address = found.address();
  Review r = Must(o, "image/png", testing::OnePixelPng());
  EXPECT_EQ(r.scan.ToString(), "infected: Eicar-Test-Signature");
  EXPECT_EQ(r.Flags(), (std::vector<std::string>{"infected"}));
  ASSERT_EQ(found.sessions().size(), 1u);
  EXPECT_EQ(found.sessions()[0].data, testing::OnePixelPng());

  testing::FakeClamd clean(testing::FakeClamd::Mode::kClean);
  o.clamd_address = clean.address();
  EXPECT_EQ(Must(o, "text/plain", "hello").scan.ToString(), "clean");

  testing::FakeClamd mute(testing::FakeClamd::Mode::kCloseNoAnswer);
  o.clamd_address = mute.address();
  Review e = Must(o, "text/plain", "hello");
  EXPECT_EQ(e.scan.ToString(), "error: clamd closed the connection without an answer");
  EXPECT_EQ(e.Flags(), (std::vector<std::string>{"scan-error"}));
}

TEST(ReviewContentTest, JsonRecordNamesHitsButNeverTheSecret) {
  Review r = Must({}, "text/plain", "k=" + kAwsKeyId);
  nlohmann::json j = ReviewToJson(r);
  EXPECT_EQ(j.dump(), nlohmann::json::parse(R"({
    "declared_media_type": "text/plain", "detected_media_type": "text/plain", "media_type": "text/plain",
    "media_type_mismatch": false, "charset": "us-ascii", "review": "text-extraction", "method": "text",
    "sha256": ")" + r.sha256_hex + R"(", "size": 22, "text_bytes": 22, "text_truncated": false,
    "deny_list_hits": [{"pattern": "aws-access-key-id", "offset": 2}], "hits_truncated": false,
    "scan": "not-configured", "notes": [], "flags": ["deny-list"]})").dump());
  EXPECT_EQ(j.dump().find("AKIA"), std::string::npos);
}

TEST(ReviewContentTest, GateTextScansBodyTextAsItStands) {
  const std::string body = "line\r\n" + kAwsKeyId;
  EXPECT_EQ(GateText({}, body).hits, (std::vector<DenyHit>{{"aws-access-key-id", 6}}));
}

TEST(ReviewContentTest, OptionsFromConfig) {
  Config c;
  auto o = OptionsFromConfig(c);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->deny_list.get(), DenyList::Builtin().get());
  EXPECT_EQ(o->clamd_address, "");
  EXPECT_EQ(o->max_text_bytes, 8u << 20);
  EXPECT_EQ(o->clamd_timeout_ms, 30000);

  c.clamd_address = "clamav";
  auto bad = OptionsFromConfig(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "clamd_address 'clamav': expected unix:/path, /path or host:port");

  c.clamd_address = "";
  c.deny_list_file = "/nonexistent/deny.toml";
  auto missing = OptionsFromConfig(c);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
}

// nlohmann holds a token whole (twice) and a bit per level: a file of any size must not make it
// hold gigabytes. A token past kMaxJsonTokenBytes or nesting past kMaxJsonDepth ends the parse,
// and the document is reviewed as text, all of it (the key after the long string is found).
TEST(ReviewStreamTest, AJsonTokenOrNestingBeyondItsBoundIsReviewedAsText) {
  std::string long_string = R"({"a": ")" + std::string(kMaxJsonTokenBytes + 10, 'a') + R"(", "k": ")" + kAwsKeyId + "\"}";
  const Review r = MustStream({}, "application/json", long_string, {size_t{8} << 20});
  EXPECT_EQ(r.method, "json-invalid-as-text");
  EXPECT_EQ(r.notes, (std::vector<std::string>{"reviewed as text: a JSON token longer than 16777216 bytes"}));
  EXPECT_EQ(r.hits, (std::vector<DenyHit>{{"aws-access-key-id", long_string.size() - kAwsKeyId.size() - 2}}));

  const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  const Review d = MustStream({}, "application/json", deep, {size_t{1} << 20});
  EXPECT_EQ(d.method, "json-invalid-as-text");
  EXPECT_EQ(d.notes, (std::vector<std::string>{"reviewed as text: JSON nested deeper than 1000000 levels"}));
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_EQ(MustStream({}, "application/json", ok, {size_t{1} << 20}).method, "json");
}

// Detection sees the item's first bytes_max bytes exactly, however the pieces fall; a JSON
// item longer than that (libmagic, given a cut prefix, says text/plain) is still parsed as JSON.
TEST(ReviewStreamTest, DetectionDoesNotDependOnThePiecesAndLongJsonIsStillJson) {
  auto bytes_max = MediaTypeBytesMax();
  ASSERT_TRUE(bytes_max.ok());
  std::string json = "[";
  while (json.size() < *bytes_max + (size_t{1} << 19)) json += R"({"note": "a line of notes"},)";
  json += R"({"key": ")" + kAwsKeyId + "\"}]";
  const Review small = MustStream({}, "", json, {size_t{1} << 20});
  const Review big = MustStream({}, "", json, {size_t{8} << 20});
  EXPECT_EQ(ReviewToJson(small).dump(), ReviewToJson(big).dump());
  EXPECT_EQ(small.detected_media_type, "text/plain");
  EXPECT_EQ(small.method, "json");
  EXPECT_EQ(small.hits.size(), 1u);
  // Text that merely opens with a bracket, and is not JSON, stays "text".
  std::string notes = "[draft] " + std::string(*bytes_max, 'x') + "\n";
  EXPECT_EQ(MustStream({}, "", notes, {size_t{1} << 20}).method, "text");
}

// The index's text is the review's kept text: a JSON item the review found invalid is extracted
// as text for the index too, though the index's extraction stops early.
TEST(ReviewStreamTest, TheIndexTextFollowsTheRecordedMethod) {
  Options o;
  o.max_text_bytes = 16;
  const std::string doc = R"({"a": "0123456789abcdefghij", "b": )" + std::string(100, ' ') + "x";
  const Review r = MustStream(o, "application/json", doc, {7});
  ASSERT_EQ(r.method, "json-invalid-as-text");
  PieceSource src(doc, {7});
  auto t = ExtractTextStream(o, "application/json", doc.size(), &src, r.method);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->text, r.text);
  PieceSource valid_src(R"({"a": "0123456789abcdefghij"})", {3});
  auto v = ExtractTextStream(o, "application/json", 29, &valid_src, "json");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->text, Must(o, "application/json", R"({"a": "0123456789abcdefghij"})").text);
}

TEST(ReviewStreamTest, ASourceThatGivesBytesAfterItsEndIsRefused) {
  class Babbling : public ByteSource {
   public:
    Result<std::string_view> Next() override { return std::string_view(n_++ == 1 ? "" : "more"); }
    Status Restart() override { return Status::Ok(); }
    int n_ = 0;
  } src;
  auto r = ReviewStream({}, "text/plain", 8, &src);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
}

}  // namespace
}  // namespace oml::review
