// Media types for review: what the bytes are (libmagic), what the submitter says they are, and
// which of the two decides how the bytes are reviewed.
//
// Contract: the detected type always comes from the bytes. The declared type is only ever used
// to refine a *text* detection (libmagic cannot tell Markdown or broken JSON from plain text);
// it never turns bytes that libmagic calls binary into text, nor text into an opaque binary.
//
// Thread safety: every function here may be called concurrently (each thread keeps its own
// libmagic handle; a magic_t must not be shared between threads).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace oml::review {

// libmagic's answer for some bytes.
struct Detected {
  std::string media_type;  // e.g. "application/pdf", "text/plain", "application/x-empty"
  std::string charset;     // e.g. "us-ascii", "utf-8", "utf-16le", "iso-8859-1", "binary"
};

// Runs libmagic (MAGIC_MIME_TYPE | MAGIC_MIME_ENCODING) on `bytes`. libmagic itself reads at
// most its bytes_max parameter (default 7 MiB on Debian 12) of a buffer. Deterministic for a
// given libmagic and magic database (libmagic-mgc) version. kInternal when libmagic cannot be
// loaded (the magic database is missing: install libmagic-mgc).
Result<Detected> DetectMediaType(std::string_view bytes);
// libmagic's bytes_max: the most of an item libmagic reads for most types, so a streaming review
// detects from exactly that prefix. Not for JSON: libmagic parses the buffer it is given, and a
// JSON item longer than the prefix is text/plain there (review.cc then tries it as JSON when it
// opens with '{' or '[').
Result<size_t> MediaTypeBytesMax();

// "Text/Markdown; charset=UTF-8 " -> "text/markdown": lowercased, parameters and surrounding
// space dropped, a few common aliases mapped to their registered name (image/jpg -> image/jpeg,
// application/x-pdf -> application/pdf, text/x-markdown -> text/markdown,
// application/x-zip-compressed -> application/zip).
std::string NormalizeMediaType(std::string_view media_type);

// Families of a normalized media type.
//   text: text/*, application/json, application/*+json, application/xml, application/*+xml,
//         */*+xml (e.g. image/svg+xml), application/x-ndjson, application/javascript, and the
//         empty file (application/x-empty, inode/x-empty).
//   pdf:  application/pdf.
//   json: application/json and application/*+json (a subset of text).
bool IsTextFamily(std::string_view normalized);
bool IsPdf(std::string_view normalized);
bool IsJson(std::string_view normalized);
// application/x-empty or inode/x-empty (libmagic's answer for zero bytes).
bool IsEmptyType(std::string_view normalized);

// The type that decides the review, and whether the declaration contradicts the bytes.
struct Resolved {
  std::string media_type;  // normalized
  bool mismatch = false;
};

// Resolves `declared` (normalized; "" when none) against `detected` (normalized):
//   - declared "" or application/octet-stream: nothing was claimed; the detected type, no
//     mismatch.
//   - both in the text family: no mismatch; the declared type when the detection is the generic
//     text/plain or the empty file (it is only a refinement: text/markdown, application/json,
//     text/csv), else the detected one (libmagic recognised e.g. JSON or CSV itself).
//   - otherwise the detected type; mismatch when the two differ.
Resolved Resolve(std::string_view declared, std::string_view detected);

}  // namespace oml::review
