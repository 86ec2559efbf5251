// Deterministic text extraction: the same bytes (and the same library versions) always give the
// same text, byte for byte.
//
// Every extractor writes through a TextSink, so all extracted text shares one normal form:
//   - valid UTF-8: each invalid byte of the input becomes U+FFFD; UTF-16 (by BOM or libmagic's
//     charset) and ISO-8859-1 are converted; a leading BOM is dropped;
//   - line endings normalized: CR LF -> LF, a lone CR -> LF;
//   - U+0000 becomes U+FFFD (PostgreSQL text cannot hold NUL);
//   - kept up to a byte limit, cut only between two characters (truncated() says so); the whole
//     text, past the limit too, goes to the sink's tap (the deny-list scans all of it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace oml::review {

// Receives the extracted text in its normal form, in pieces of any size (a piece may end inside
// a character: pieces are consecutive bytes of one UTF-8 text). The deny-list's streaming scan
// (deny_list.h DenyScanner) and the PDF child's pipe (pdf_sandbox.h) are taps.
class TextTap {
 public:
  virtual ~TextTap() = default;
  virtual void Text(std::string_view piece) = 0;
};

// The one writer of extracted text. It keeps the first max_bytes of the text (the text a review
// stores, e.g. for the search index) and, when it has a tap, hands every byte of the text to the
// tap as well, however long the text grows: the tap sees the whole text, the kept text is its
// prefix.
//
// Input may arrive in pieces cut anywhere: AppendUtf8 and AppendUtf16 keep an incomplete
// character at the end of one call and complete it with the next; Finish() turns one still
// incomplete into U+FFFD. Append after Finish() continues as a new stream would.
class TextSink {
 public:
  explicit TextSink(size_t max_bytes, TextTap* tap = nullptr) : max_bytes_(max_bytes), tap_(tap) {}
  ~TextSink();  // wipes what it holds (plaintext-derived)
  TextSink(const TextSink&) = delete;
  TextSink& operator=(const TextSink&) = delete;

  // Appends one code point in the normal form above. Surrogates and values above U+10FFFF
  // become U+FFFD. Once the kept text is full, appends go to the tap only (none without one).
  // Any append but one of the same encoding (AppendUtf8 after AppendUtf8, AppendUtf16 of the
  // same byte order) first ends a held incomplete character as U+FFFD, as Finish() would.
  void AppendCodePoint(uint32_t cp);
  // Decodes UTF-8 (invalid bytes -> U+FFFD) and appends.
  void AppendUtf8(std::string_view s);
  void AppendLatin1(std::string_view s);
  // UTF-16 code units, little or big endian; a lone surrogate or an odd final byte -> U+FFFD.
  void AppendUtf16(std::string_view s, bool big_endian);
  // Ends the input: an incomplete character left by the last append becomes U+FFFD, and the
  // tap receives everything not yet handed over.
  void Finish();

  // The kept text is a prefix of the whole: something did not fit under max_bytes.
  bool truncated() const { return truncated_; }
  // The extraction itself stopped early (e.g. a PDF's page cap): part of the input's text was
  // never produced, so neither kept nor seen by the tap.
  void MarkIncomplete() { incomplete_ = true; }
  bool incomplete() const { return incomplete_; }
  // Nothing more appended is of use: the kept text is full and there is no tap. Extractors stop.
  bool full() const { return truncated_ && tap_ == nullptr; }
  // Bytes of text produced so far (kept or not).
  uint64_t total_bytes() const { return total_; }
  const std::string& text() const { return out_; }
  // Bytes that can still be kept before the cap.
  size_t remaining() const { return out_.size() < max_bytes_ ? max_bytes_ - out_.size() : 0; }
  // The kept text so far, leaving the sink empty (a decoder's output taken piece by piece; with
  // an unbounded max_bytes nothing is ever cut).
  std::string DrainKept() {
    std::string s;
    s.swap(out_);
    return s;
  }
  // Finish(), then the kept text.
  std::string Take() {
    Finish();
    return std::move(out_);
  }

 private:
  // Decode p[0, n); return the bytes consumed: all of them, unless !final and the input ends
  // inside a character that is well-formed so far (left for the next call).
  size_t DecodeUtf8(const unsigned char* p, size_t n, bool final);
  void Put(uint32_t cp);  // AppendCodePoint without ending a held character
  void FlushPartial();    // a held incomplete character becomes U+FFFD
  size_t DecodeUtf16(const unsigned char* p, size_t n, bool big_endian, bool final);

  std::string out_;
  size_t max_bytes_;
  TextTap* tap_;
  std::string tap_buf_;  // text not yet handed to the tap
  std::string partial_;  // an incomplete character from the last AppendUtf8 / AppendUtf16
  bool partial_utf16_ = false, partial_big_endian_ = false;
  uint64_t total_ = 0;
  bool truncated_ = false;
  bool incomplete_ = false;
  bool last_was_cr_ = false;
};

// A text/* body arriving in pieces: the BOM (from the first bytes) or else `charset` (libmagic's:
// "utf-16le", "utf-16be", "iso-8859-1"; anything else is UTF-8) picks the decoding once.
class PlainTextDecoder {
 public:
  PlainTextDecoder(std::string_view charset, TextSink* sink) : charset_(charset), sink_(sink) {}
  void Feed(std::string_view bytes);
  // Ends the input (TextSink::Finish).
  void Finish();

 private:
  void Decode(std::string_view bytes);
  // Decides the decoding from head_ (the BOM, else the charset) and decodes head_ after the BOM.
  void Settle();
  std::string charset_;
  TextSink* sink_;
  std::string head_;  // the first bytes, until the BOM question is settled
  enum class Mode { kUndecided, kUtf8, kUtf16Le, kUtf16Be, kLatin1 } mode_ = Mode::kUndecided;
};

// The text of a whole text/* body (PlainTextDecoder in one piece, then Finish).
void ExtractPlainText(std::string_view bytes, std::string_view charset, TextSink* sink);

// JSON: every object key and every string value, in document order, each followed by "\n"
// (numbers, booleans and null are not text and are left out). `json_utf8` must already be
// UTF-8 (decode it with ExtractPlainText first). Streams with nlohmann's SAX parser: no
// document tree, no recursion, so nesting depth costs no stack. Returns false when the input is
// not one valid JSON value (the sink then holds a partial extraction: discard it); when the
// sink is full (TextSink::full), stops early and returns true.
bool ExtractJson(std::string_view json_utf8, TextSink* sink);

// The same over UTF-8 that arrives in pieces: `next` returns the next piece, "" at the end (a
// piece must stay valid until the next call). Reads no further than the parser needs (stops at
// the first error). The parse holds one piece and the current token (nlohmann's lexer keeps a
// token whole, twice) and one bit per level of nesting, so both are bounded: a token longer
// than kMaxJsonTokenBytes (more input than that without a complete value, key or bracket) or
// nesting deeper than kMaxJsonDepth ends the parse as not JSON, and *not_json (if given) says
// which; the caller reviews the document as text instead. Rethrows std::bad_alloc.
inline constexpr uint64_t kMaxJsonTokenBytes = uint64_t{16} << 20;
inline constexpr size_t kMaxJsonDepth = 1000000;
class JsonPieces {
 public:
  virtual ~JsonPieces() = default;
  virtual std::string_view Next() = 0;
};
bool ExtractJsonPieces(JsonPieces* pieces, TextSink* sink, std::string* not_json = nullptr);

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
// At most kMaxPdfPages pages are read; beyond, the sink is marked incomplete.
inline constexpr int kMaxPdfPages = 10000;
// Serialized process-wide (poppler's global state is not documented as thread-safe): the server
// never calls it, it runs in a child process per file (pdf_sandbox.h).
// poppler's own error messages are silenced, never written to stderr. Throws std::bad_alloc when
// an allocation fails (under the sandbox's RLIMIT_AS: the memory limit); any other exception of
// poppler's is an unreadable file.
PdfText ExtractPdf(std::string_view bytes, TextSink* sink);

}  // namespace oml::review
