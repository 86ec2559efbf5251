#include "review/extract.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>

#include "common/temp_dir_testing.h"
#include "review/pdf_testing.h"

namespace oml::review {
namespace {

constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();
const std::string kFffd = "\xEF\xBF\xBD";

std::string Plain(std::string_view bytes, std::string_view charset = "utf-8", size_t cap = kUnlimited,
                  bool* truncated = nullptr) {
  TextSink sink(cap);
  ExtractPlainText(bytes, charset, &sink);
  if (truncated) *truncated = sink.truncated();
  return sink.Take();
}

TEST(TextSinkTest, NormalizesLineEndingsAndNul) {
  EXPECT_EQ(Plain("a\r\nb\rc\n\r\nd"), "a\nb\nc\n\nd");
  EXPECT_EQ(Plain("\r\r\n"), "\n\n");
  EXPECT_EQ(Plain(std::string("x\0y", 3)), "x" + kFffd + "y");
  // A CR LF split over two appends is still one line ending.
  TextSink sink(kUnlimited);
  sink.AppendUtf8("a\r");
  sink.AppendUtf8("\nb");
  EXPECT_EQ(sink.Take(), "a\nb");
}

TEST(TextSinkTest, ReplacesEachInvalidUtf8ByteAndKeepsValidOnes) {
  EXPECT_EQ(Plain("\xF0\x9F\x98\x80 caf\xC3\xA9"), "\xF0\x9F\x98\x80 caf\xC3\xA9");
  EXPECT_EQ(Plain("\xC0\xAF"), kFffd + kFffd);                     // overlong '/'
  EXPECT_EQ(Plain("\xED\xA0\x80"), kFffd + kFffd + kFffd);         // an encoded surrogate
  EXPECT_EQ(Plain("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
  EXPECT_EQ(Plain("a\xE2\x82"), "a" + kFffd + kFffd);              // cut short at the end
  EXPECT_EQ(Plain("\xFF"), kFffd);
  EXPECT_EQ(Plain("\xEF\xBB\xBFhi"), "hi");                        // the BOM goes
}

TEST(TextSinkTest, ConvertsUtf16AndLatin1) {
  // "hi" U+1F600 by BOM (little endian), with a lone low surrogate and an odd final byte.
  EXPECT_EQ(Plain(std::string("\xFF\xFEh\0i\0\x3D\xD8\x00\xDE\x00\xDC!", 13)),
            "hi\xF0\x9F\x98\x80" + kFffd + kFffd);
  EXPECT_EQ(Plain(std::string("\xFE\xFF\0h\0\r\0\n", 8)), "h\n");   // big endian by BOM
  EXPECT_EQ(Plain(std::string("h\0i\0", 4), "utf-16le"), "hi");     // by libmagic's charset
  EXPECT_EQ(Plain(std::string("\0h\0i", 4), "utf-16be"), "hi");
  EXPECT_EQ(Plain("caf\xE9", "iso-8859-1"), "caf\xC3\xA9");
}

TEST(TextSinkTest, CapCutsBetweenCharacters) {
  bool truncated = false;
  EXPECT_EQ(Plain("a\xC3\xA9z", "utf-8", 2, &truncated), "a");  // é (2 bytes) does not fit after a
  EXPECT_TRUE(truncated);
  EXPECT_EQ(Plain("abc", "utf-8", 3, &truncated), "abc");      // exactly full is not truncated
  EXPECT_FALSE(truncated);
  EXPECT_EQ(Plain("abcd", "utf-8", 3, &truncated), "abc");
  EXPECT_TRUE(truncated);
}

std::string Json(std::string_view in, bool* ok, size_t cap = kUnlimited) {
  TextSink sink(cap);
  *ok = ExtractJson(in, &sink);
  return sink.Take();
}

TEST(ExtractJsonTest, KeysAndStringValuesInDocumentOrder) {
  bool ok = false;
  EXPECT_EQ(Json(R"({"b": ["x\r\ny", 1, true, null, 2.5, {"k": "\u0041KIA"}], "a": "z", "": ""})", &ok),
            "b\nx\ny\nk\nAKIA\na\nz\n\n\n");
  EXPECT_TRUE(ok);
  EXPECT_EQ(Json(R"("just a string")", &ok), "just a string\n");
  EXPECT_TRUE(ok);
  EXPECT_EQ(Json("[1, 2, 3]", &ok), "");
  EXPECT_TRUE(ok);
}

TEST(ExtractJsonTest, InvalidJsonIsReported) {
  bool ok = true;
  for (const char* bad : {"{\"a\": ", "{'a': 1}", "[1,]", "{\"a\":1} trailing", "", "\"\xFF\""}) {
    (void)Json(bad, &ok);
    EXPECT_FALSE(ok) << bad;
  }
}

TEST(ExtractJsonTest, DeepNestingCostsNoStack) {
  bool ok = false;
  const std::string deep = std::string(200000, '[') + "\"deep\"" + std::string(200000, ']');
  EXPECT_EQ(Json(deep, &ok), "deep\n");
  EXPECT_TRUE(ok);
}

TEST(ExtractJsonTest, StopsWhenTheCapIsReached) {
  bool ok = false;
  TextSink sink(6);
  ok = ExtractJson(R"(["abc", "def", "ghi"])", &sink);
  EXPECT_TRUE(ok);
  EXPECT_TRUE(sink.truncated());
  EXPECT_EQ(sink.text(), "abc\nde");  // the cap may fall inside a value
}

const std::vector<std::vector<std::string>> kTwoPages = {{"Hello PDF page one", "second (line)"},
                                                         {"Page two AKIAIOSFODNN7EXAMPLE"}};
const std::string kTwoPagesText = "Hello PDF page one\nsecond (line)\n\n\fPage two AKIAIOSFODNN7EXAMPLE\n\n\f";

TEST(ExtractPdfTest, PageTextInPageOrder) {
  TextSink sink(kUnlimited);
  PdfText r = ExtractPdf(testing::MakePdf(kTwoPages), &sink);
  EXPECT_EQ(r.outcome, PdfOutcome::kOk);
  EXPECT_EQ(r.pages, 2);
  EXPECT_EQ(r.pages_extracted, 2);
  EXPECT_TRUE(r.notes.empty());
  EXPECT_EQ(sink.text(), kTwoPagesText);
  EXPECT_FALSE(sink.truncated());
}

// pdftotext (poppler-utils) is a second reader of the same file: its default output must equal
// ours byte for byte (it shares the poppler library, but not our use of poppler-cpp's API).
TEST(ExtractPdfTest, AgreesWithPdftotext) {
  if (std::system("command -v pdftotext >/dev/null 2>&1") != 0) GTEST_SKIP() << "pdftotext not installed (poppler-utils)";
  oml::testing::ScopedTempDir dir("oml-review-pdf");
  const auto pdf = dir.path() / "two.pdf";
  std::ofstream(pdf, std::ios::binary) << testing::MakePdf(kTwoPages);
  const std::string cmd = "pdftotext -q -enc UTF-8 '" + pdf.string() + "' -";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0);
  EXPECT_EQ(out, kTwoPagesText);
}

TEST(ExtractPdfTest, EncryptedCorruptAndEmpty) {
  TextSink a(kUnlimited);
  EXPECT_EQ(ExtractPdf(testing::MakePdf({{"secret"}}, /*encrypt=*/true), &a).outcome, PdfOutcome::kEncrypted);
  EXPECT_EQ(a.text(), "");
  TextSink b(kUnlimited);
  EXPECT_EQ(ExtractPdf("%PDF-1.4\ngarbage\n", &b).outcome, PdfOutcome::kUnreadable);
  EXPECT_EQ(b.text(), "");
  TextSink c(kUnlimited);
  PdfText r = ExtractPdf(testing::MakePdf({{}}), &c);
  EXPECT_EQ(r.outcome, PdfOutcome::kOk);
  EXPECT_EQ(r.pages, 1);
  EXPECT_EQ(c.text(), "\f");
}

// Every prefix of a valid PDF: poppler either reads it (repairing the cross-reference table) or
// refuses it; it never crashes, and the same prefix always gives the same answer.
TEST(ExtractPdfTest, EveryTruncationIsReadOrRefusedDeterministically) {
  const std::string pdf = testing::MakePdf(kTwoPages);
  int read = 0, refused = 0;
  for (size_t len = 0; len < pdf.size(); ++len) {
    std::string_view prefix(pdf.data(), len);
    TextSink s1(kUnlimited), s2(kUnlimited);
    PdfText r1 = ExtractPdf(prefix, &s1), r2 = ExtractPdf(prefix, &s2);
    ASSERT_TRUE(r1.outcome == PdfOutcome::kOk || r1.outcome == PdfOutcome::kUnreadable) << len;
    ASSERT_EQ(r1.outcome, r2.outcome) << len;
    ASSERT_EQ(s1.text(), s2.text()) << len;
    (r1.outcome == PdfOutcome::kOk ? read : refused)++;
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(read, 0);
}

TEST(ExtractPdfTest, CapCutsTheTextAndCountsWholePagesOnly) {
  TextSink sink(40);
  PdfText r = ExtractPdf(testing::MakePdf(kTwoPages), &sink);
  EXPECT_EQ(r.outcome, PdfOutcome::kOk);
  EXPECT_EQ(r.pages, 2);
  EXPECT_EQ(r.pages_extracted, 1);
  EXPECT_TRUE(sink.truncated());
  EXPECT_EQ(sink.text(), "Hello PDF page one\nsecond (line)\n\n\fPage ");  // 35 + 5 bytes
}

// A tap that keeps everything it is given.
class KeepAll : public TextTap {
 public:
  void Text(std::string_view piece) override { all.append(piece); }
  std::string all;
};

// The decoders cut anywhere give what they give whole: every cut of every byte sequence below
// (partial UTF-8 sequences, surrogate pairs and odd bytes of UTF-16, CR LF, BOMs) in 1, 2 and 3
// pieces, and the tap sees the whole text while the sink keeps a prefix.
TEST(TextSinkTest, PiecesCutAnywhereDecodeAsTheWhole) {
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"utf-8", "a\xC3\xA9z\r\n\xE2\x82\xAC \xF0\x9F\x98\x80 \xC3 \xE2\x82 \xF4\x90\x80\x80 \xED\xA0\x80 end\xF0\x9F"},
      {"utf-8", "\xEF\xBB\xBF" "bom\r"},
      {"utf-16le", std::string("h\0\x3D\xD8\x00\xDE\r\0\n\0\x00\xD8x\0z", 15)},
      {"utf-16be", std::string("\xFE\xFF\0h\xD8\x3D\xDE\x00\xDC\x00\0!", 13)},
      {"iso-8859-1", "caf\xE9\r\n"},
      {"utf-8", "ab"},
  };
  for (const auto& [charset, bytes] : inputs) {
    TextSink whole(kUnlimited);
    ExtractPlainText(bytes, charset, &whole);
    const std::string expect = whole.Take();
    for (size_t a = 0; a <= bytes.size(); ++a) {
      for (size_t b = a; b <= bytes.size(); ++b) {
        KeepAll tap;
        TextSink sink(5, &tap);
        PlainTextDecoder dec(charset, &sink);
        dec.Feed(std::string_view(bytes).substr(0, a));
        dec.Feed(std::string_view(bytes).substr(a, b - a));
        dec.Feed(std::string_view(bytes).substr(b));
        dec.Finish();
        SCOPED_TRACE(charset + " cut at " + std::to_string(a) + ", " + std::to_string(b));
        EXPECT_EQ(tap.all, expect);
        EXPECT_EQ(sink.total_bytes(), expect.size());
        const std::string kept = sink.Take();
        EXPECT_TRUE(expect.starts_with(kept));
        EXPECT_LE(kept.size(), 5u);
        EXPECT_EQ(sink.truncated(), kept.size() < expect.size());
      }
    }
  }
}

// An append of another kind ends a held incomplete character first (never completed across it).
TEST(TextSinkTest, AnotherKindOfAppendEndsAHeldCharacter) {
  TextSink a(kUnlimited);
  a.AppendUtf8("a\xC3");
  a.AppendCodePoint('\f');
  a.AppendUtf8("\xA9" "b");
  EXPECT_EQ(a.Take(), "a" + kFffd + "\f" + kFffd + "b");
  TextSink b(kUnlimited);
  b.AppendUtf8("\xC3");
  b.AppendUtf16(std::string("A\0", 2), false);
  EXPECT_EQ(b.Take(), kFffd + "A");
  TextSink c(kUnlimited);
  c.AppendUtf16(std::string("\x3D\xD8", 2), false);  // a high surrogate, held
  c.AppendLatin1("\xE9");
  EXPECT_EQ(c.Take(), kFffd + "\xC3\xA9");
}

TEST(TextSinkTest, WithATapNothingIsFullAndWithoutOneExtractorsStop) {
  KeepAll tap;
  TextSink tapped(0, &tap);
  tapped.AppendUtf8("abc");
  EXPECT_TRUE(tapped.truncated());
  EXPECT_FALSE(tapped.full());
  tapped.Finish();
  EXPECT_EQ(tap.all, "abc");
  TextSink plain(2);
  plain.AppendUtf8("abc");
  EXPECT_TRUE(plain.full());
  EXPECT_EQ(plain.Take(), "ab");
}

// JSON from pieces: the same text as the whole, whatever the cuts; an invalid document fails.
class VectorPieces : public JsonPieces {
 public:
  VectorPieces(std::string s, size_t n) {
    for (size_t i = 0; i < s.size(); i += n) pieces_.push_back(s.substr(i, n));
  }
  std::string_view Next() override { return at_ < pieces_.size() ? std::string_view(pieces_[at_++]) : std::string_view(); }

 private:
  std::vector<std::string> pieces_;
  size_t at_ = 0;
};

TEST(ExtractJsonTest, PiecesGiveTheWholeText) {
  const std::string doc = R"({"a\u00e9": ["x\ny", {"k": "v"}], "n": 12.5e3, "t": true, "s": "\ud83d\ude00"})";
  TextSink whole(kUnlimited);
  ASSERT_TRUE(ExtractJson(doc, &whole));
  const std::string expect = whole.Take();
  for (size_t n : {1, 2, 3, 5, 64}) {
    VectorPieces pieces(doc, n);
    TextSink sink(kUnlimited);
    EXPECT_TRUE(ExtractJsonPieces(&pieces, &sink));
    EXPECT_EQ(sink.Take(), expect) << n;
    VectorPieces bad(doc.substr(0, doc.size() - 1), n);
    TextSink discard(kUnlimited);
    EXPECT_FALSE(ExtractJsonPieces(&bad, &discard)) << n;
  }
}

}  // namespace
}  // namespace oml::review
