// Review per type: what an attachment (or an inline body) is, what of it a reviewer can read,
// and what in it should make a reviewer look twice.
//
// ReviewContent is a pure function of (options, declared media type, bytes) apart from the
// optional clamd call: no database, no object store, no clock. ReviewStream is the same review
// over bytes read in pieces, in bounded memory whatever the size (issue 22): the type is
// detected from exactly the first MediaTypeBytesMax() bytes (libmagic's bytes_max), then every
// piece goes through the extractor, the SHA-256 and clamd as it is read, and the extracted text
// through the deny-list in windows (deny_list.h DenyScanner). Both give the same Review for the
// same bytes. admission/ calls it for every
// attachment of a claim and for inline body text, and records the result with the claim; a
// deny-list hit or an infected scan flags the claim, it never refuses it (issue 9).
//
// What is reviewed per type (docs/operations/review.md has the table):
//
//   type (resolved, media_type.h)         kind              method
//   zero bytes                            text-extraction   empty
//   text/*, incl. text/markdown, csv      text-extraction   text
//   application/json, application/*+json text-extraction   json | json-invalid-as-text
//   XML, SVG, NDJSON, JavaScript          text-extraction   text
//   application/pdf                       text-extraction   pdf
//   application/pdf, password needed      opaque            pdf-encrypted
//   application/pdf, poppler cannot open  opaque            pdf-unreadable
//   application/pdf above 2 GiB - 1       opaque            pdf-too-large
//   application/pdf, extractor limit hit  opaque            pdf-limit (memory, CPU, time or
//                                                           no slot: pdf_sandbox.h)
//   anything else (images, archives, ...) opaque            binary
//
// Every kind gets the SHA-256 and size of the bytes and, when clamd is configured, a ClamAV
// scan of the bytes. Text extraction feeds the deny-list; an opaque review has no text and no
// hits (the scan is all there is).
//
// Thread safety: ReviewContent may run concurrently. With Options::pdf set (the server), PDFs are
// extracted in child processes (pdf_sandbox.h), bounded per tenant; without it (tests, tools),
// in-process, serialized.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "review/clamd.h"
#include "review/deny_list.h"
#include "review/pdf_sandbox.h"

namespace oml::review {

struct Options {
  std::shared_ptr<const DenyList> deny_list;  // null: DenyList::Builtin()
  std::string clamd_address;                  // "": no scan (ScanResult "not-configured")
  int clamd_timeout_ms = 30000;               // per socket operation (clamd.h)
  size_t max_text_bytes = 8 << 20;            // cap of the extracted text (extract.h)
  size_t max_hits = 1000;                     // deny-list hits listed per review
  // PDF extraction in child processes with limits (pdf_sandbox.h); null: in-process (ExtractPdf).
  std::shared_ptr<PdfSandbox> pdf;
};

// From the config keys deny_list_file, clamd_address, clamd_timeout_ms, review_max_text_bytes
// (common/config.h). Loads and compiles the deny-list file: its errors (kNotFound,
// kInvalidArgument naming the pattern) are returned here, at startup, not at the first claim.
Result<Options> OptionsFromConfig(const Config& config);
// The server's PDF extractor (pdf_sandbox.h) from the pdf_extract_* keys; `binary` is the oml
// executable that answers `__extract-pdf` (the running one: /proc/self/exe).
Result<std::shared_ptr<PdfSandbox>> PdfSandboxFromConfig(const Config& config, const std::string& binary);

enum class ReviewKind { kTextExtraction, kOpaque };
const char* ReviewKindName(ReviewKind k);  // "text-extraction" | "opaque"

struct Review {
  std::string declared_media_type;  // normalized (media_type.h); "" when none was declared
  std::string detected_media_type;  // libmagic's, from the bytes
  std::string media_type;           // the resolved type that chose the review (media_type.h)
  bool media_type_mismatch = false; // the declaration contradicts the bytes
  std::string charset;              // libmagic's charset for text types; "" otherwise
  ReviewKind kind = ReviewKind::kOpaque;
  std::string method;               // see the table above
  std::string sha256_hex;           // of the bytes as given (the plaintext)
  uint64_t size = 0;

  // kTextExtraction only: the first Options::max_text_bytes of the extracted text in extract.h's
  // normal form (valid UTF-8, LF line endings), kept for the search index; text_kept_truncated
  // when the text is longer. text_bytes counts all of it: the deny-list scanned all of it.
  std::string text;
  bool text_kept_truncated = false;
  uint64_t text_bytes = 0;
  // The extraction stopped before the end of the input (a PDF's page cap): the rest of its text
  // was neither extracted nor scanned.
  bool text_truncated = false;
  int pdf_pages = 0;                // application/pdf: pages in the document

  // Deny-list hits in `text` (offsets into `text`); never the matched bytes.
  std::vector<DenyHit> hits;
  bool hits_truncated = false;
  ScanResult scan;
  // Things the reviewer should know that fit no field, in a fixed order (e.g. "embedded files
  // not reviewed", "page 3 unreadable").
  std::vector<std::string> notes;

  // Why a reviewer should look at this, in this order, each at most once:
  //   "deny-list"           at least one hit
  //   "infected"            the scan found a signature
  //   "scan-error"          clamd is configured but gave no verdict
  //   "media-type-mismatch" the declared type contradicts the bytes
  //   "text-truncated"      part of the text was not extracted (nor scanned): a PDF's page cap
  //   "not-extracted"       a PDF whose text could not be read (encrypted, unreadable, too large)
  // A deny-list hit or "infected" flags the claim; what the others do is admission's call.
  std::vector<std::string> Flags() const;
};

// Reviews `bytes`, declared as `declared_media_type` ("" when none). The only error is
// kInternal when libmagic cannot be loaded; everything about the bytes (corrupt PDF, invalid
// JSON, clamd unreachable) is a field of the Review.
// `tenant` bounds the concurrent PDF extractions of one tenant (Options::pdf); "" for none.
Result<Review> ReviewContent(const Options& options, std::string_view declared_media_type, std::string_view bytes,
                             const std::string& tenant = "");

// Bytes to review, read in pieces from the first byte.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // The next piece, "" at the end; valid until the next call. An error ends the review with it.
  virtual Result<std::string_view> Next() = 0;
  // Reads again from the first byte. Needed only when a declared or detected JSON turns out not
  // to be JSON and is reviewed again as plain text (after the first pass read every byte).
  virtual Status Restart() = 0;
};

// The review of the `size` bytes `source` gives, as ReviewContent would give it for them
// whole, in bounded memory: about MediaTypeBytesMax() + Options::max_text_bytes + one piece +
// the deny-list window, whatever `size` is (PDFs: the server streams them into the extractor's
// child, which holds the file; pdf_sandbox.h). kDataLoss "integrity" when the source gives
// other than `size` bytes; the source's errors are returned as they are.
Result<Review> ReviewStream(const Options& options, std::string_view declared_media_type, uint64_t size,
                            ByteSource* source, const std::string& tenant = "");

// The extracted text only (Review::text and the type fields; no deny-list, no scan, no SHA-256):
// for the search index. `recorded_method` is the method ReviewStream recorded for the same
// bytes ("json", "json-invalid-as-text", "text", ...): a JSON item is parsed only if it was
// parsed then, so the text is the review's kept text even though this reads no further than
// that text needs (a text or JSON item stops once max_text_bytes are kept). "" decides as
// ReviewStream does.
Result<Review> ExtractTextStream(const Options& options, std::string_view declared_media_type, uint64_t size,
                                 ByteSource* source, std::string_view recorded_method,
                                 const std::string& tenant = "");

// The same deny-list gate on text as it stands (e.g. an inline body already known to be text):
// offsets are into `text` itself, without extract.h's normalization.
ScanHits GateText(const Options& options, std::string_view text);

// The review as the API reports it (docs/operations/review.md, "The review record"), without
// the text: {declared_media_type, detected_media_type, media_type, media_type_mismatch,
// charset?, review, method, sha256, size, text_bytes (all extracted, all scanned),
// text_truncated (extraction stopped early), pdf_pages?,
// deny_list_hits: [{pattern, offset}], hits_truncated, scan, notes, flags}.
nlohmann::json ReviewToJson(const Review& review);

}  // namespace oml::review
