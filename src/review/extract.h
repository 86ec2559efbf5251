// Deterministic text extraction: the same bytes (and the same library versions) always give the
// same text, byte for byte.
//
// Every extractor writes through a TextSink, so all extracted text shares one normal form:
//   - valid UTF-8: each invalid byte of the input becomes U+FFFD; UTF-16 (by BOM or libmagic's
//     charset) and ISO-8859-1 are converted; a leading BOM is dropped;
//   - line endings normalized: CR LF -> LF, a lone CR -> LF;
//   - U+0000 becomes U+FFFD (PostgreSQL text cannot hold NUL);
//   - capped at a byte limit, cut only between two characters; truncated() says so and nothing
//     after the cut was extracted (nor is it scanned by the deny-list).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace oml::review {

class TextSink {
 public:
  explicit TextSink(size_t max_bytes) : max_bytes_(max_bytes) {}
  TextSink(const TextSink&) = delete;
  TextSink& operator=(const TextSink&) = delete;

  // Appends one code point in the normal form above. Surrogates and values above U+10FFFF
  // become U+FFFD. After the cap is reached every append is dropped.
  void AppendCodePoint(uint32_t cp);
  // Decodes UTF-8 (invalid bytes -> U+FFFD) and appends.
  void AppendUtf8(std::string_view s);
  void AppendLatin1(std::string_view s);
  // UTF-16 code units, little or big endian; a lone surrogate or an odd final byte -> U+FFFD.
  void AppendUtf16(std::string_view s, bool big_endian);

  // Something did not fit (or MarkTruncated was called): the text is a prefix of the whole.
  bool truncated() const { return truncated_; }
  void MarkTruncated() { truncated_ = true; }
  const std::string& text() const { return out_; }
  // Bytes that can still be appended before the cap.
  size_t remaining() const { return out_.size() < max_bytes_ ? max_bytes_ - out_.size() : 0; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
  size_t max_bytes_;
  bool truncated_ = false;
  bool last_was_cr_ = false;
};

// The text of a text/* body: `charset` is libmagic's ("utf-16le", "iso-8859-1", ...); a BOM
// overrides it; anything else is read as UTF-8.
void ExtractPlainText(std::string_view bytes, std::string_view charset, TextSink* sink);

// JSON: every object key and every string value, in document order, each followed by "\n"
// (numbers, booleans and null are not text and are left out). `json_utf8` must already be
// UTF-8 (decode it with ExtractPlainText first). Streams with nlohmann's SAX parser: no
// document tree, no recursion, so nesting depth costs no stack. Returns false when the input is
// not one valid JSON value (the sink then holds a partial extraction: discard it); when the
// sink fills up, stops early and returns true.
bool ExtractJson(std::string_view json_utf8, TextSink* sink);

// PDF, through poppler-cpp: each page's text in page order in poppler's reading order (the
// layout `pdftotext` uses by default), each page ending in "\f" (poppler's own page break; one
// is added where a page's text lacks it), as pdftotext writes it.
enum class PdfOutcome {
  kOk,           // text extracted (possibly empty: a scanned PDF has no text layer)
  kEncrypted,    // needs a password: nothing extracted
  kUnreadable,   // poppler cannot open it (corrupt, truncated, not a PDF)
  kTooLarge,     // above 2 GiB - 1 (poppler takes an int length)
  kLimit,        // the isolated extractor hit a limit (pdf_sandbox.h): memory, CPU, time, slots
};
struct PdfText {
  PdfOutcome outcome = PdfOutcome::kOk;
  int pages = 0;                    // pages in the document (kOk, kEncrypted when known)
  int pages_extracted = 0;          // pages whose text was read before the cap
  std::vector<std::string> notes;   // e.g. "page 3 unreadable", "embedded files not reviewed"
};
// At most kMaxPdfPages pages are read; beyond, the sink is marked truncated.
inline constexpr int kMaxPdfPages = 10000;
// Serialized process-wide (poppler's global state is not documented as thread-safe): the server
// never calls it, it runs in a child process per file (pdf_sandbox.h).
// poppler's own error messages are silenced, never written to stderr. Throws std::bad_alloc when
// an allocation fails (under the sandbox's RLIMIT_AS: the memory limit); any other exception of
// poppler's is an unreadable file.
PdfText ExtractPdf(std::string_view bytes, TextSink* sink);

}  // namespace oml::review
