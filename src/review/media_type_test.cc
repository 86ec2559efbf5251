#include "review/media_type.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "review/pdf_testing.h"
#include "review/test_bytes_testing.h"

namespace oml::review {
namespace {

void ExpectDetected(std::string_view bytes, const std::string& type, const std::string& charset) {
  auto d = DetectMediaType(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->media_type, type);
  EXPECT_EQ(d->charset, charset);
}

TEST(DetectMediaTypeTest, NamesCommonFormatsFromTheirBytes) {
  ExpectDetected(testing::OnePixelPng(), "image/png", "binary");
  ExpectDetected(testing::MakePdf({{"hello"}}), "application/pdf", "iso-8859-1");
  ExpectDetected("hello world\n", "text/plain", "us-ascii");
  ExpectDetected(testing::EmptyZip(), "application/zip", "binary");
  ExpectDetected("{\"a\": [1, \"b\"]}\n", "application/json", "us-ascii");
  ExpectDetected("", "application/x-empty", "binary");
  ExpectDetected(std::string("\xFF\xFEh\0i\0\n\0", 8), "text/plain", "utf-16le");
  ExpectDetected("caf\xE9 au lait\n", "text/plain", "iso-8859-1");
  ExpectDetected(std::string("\x01\x02\x03\xFF\x00\x10", 6), "application/octet-stream", "binary");
}

TEST(DetectMediaTypeTest, WorksOnManyThreadsAtOnce) {
  const std::string png = testing::OnePixelPng();
  std::vector<std::thread> ts;
  std::atomic<int> right{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto d = DetectMediaType(i % 2 ? png : std::string("plain text\n"));
        if (d.ok() && d->media_type == (i % 2 ? "image/png" : "text/plain")) ++right;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(right.load(), 200);
}

TEST(NormalizeMediaTypeTest, LowercasesDropsParametersAndMapsAliases) {
  EXPECT_EQ(NormalizeMediaType(" Text/Markdown; charset=UTF-8 "), "text/markdown");
  EXPECT_EQ(NormalizeMediaType("image/jpg"), "image/jpeg");
  EXPECT_EQ(NormalizeMediaType("APPLICATION/X-PDF"), "application/pdf");
  EXPECT_EQ(NormalizeMediaType("text/x-markdown"), "text/markdown");
  EXPECT_EQ(NormalizeMediaType("application/x-zip-compressed"), "application/zip");
  EXPECT_EQ(NormalizeMediaType(""), "");
}

TEST(MediaTypeFamilyTest, TextPdfJson) {
  for (const char* t : {"text/plain", "text/markdown", "text/csv", "application/json", "application/ld+json",
                        "application/xml", "image/svg+xml", "application/x-ndjson", "application/x-empty"})
    EXPECT_TRUE(IsTextFamily(t)) << t;
  for (const char* t : {"application/pdf", "image/png", "application/zip", "application/octet-stream", "application/jsonx"})
    EXPECT_FALSE(IsTextFamily(t)) << t;
  EXPECT_TRUE(IsJson("application/vnd.api+json"));
  EXPECT_FALSE(IsJson("text/json+x"));
  EXPECT_TRUE(IsPdf("application/pdf"));
}

TEST(ResolveMediaTypeTest, TheBytesDecideTheDeclarationOnlyRefinesText) {
  struct Case {
    const char* declared;
    const char* detected;
    const char* resolved;
    bool mismatch;
  } cases[] = {
      {"", "image/png", "image/png", false},
      {"application/octet-stream", "text/plain", "text/plain", false},
      {"text/markdown", "text/plain", "text/markdown", false},      // a refinement of generic text
      {"application/json", "text/plain", "application/json", false},
      {"text/plain", "application/json", "application/json", false},  // libmagic knows better
      {"text/markdown", "application/x-empty", "text/markdown", false},
      {"text/csv", "text/html", "text/html", false},
      {"text/plain", "image/png", "image/png", true},                // text claimed, binary found
      {"image/png", "text/plain", "text/plain", true},               // binary claimed, text found
      {"application/pdf", "text/plain", "text/plain", true},
      {"text/plain", "application/pdf", "application/pdf", true},
      {"image/jpeg", "image/png", "image/png", true},
      {"application/pdf", "application/pdf", "application/pdf", false},
  };
  for (const auto& c : cases) {
    Resolved r = Resolve(c.declared, c.detected);
    EXPECT_EQ(r.media_type, c.resolved) << c.declared << " vs " << c.detected;
    EXPECT_EQ(r.mismatch, c.mismatch) << c.declared << " vs " << c.detected;
  }
}

}  // namespace
}  // namespace oml::review
