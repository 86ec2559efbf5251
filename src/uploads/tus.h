// The header grammar of tus 1.0 (https://tus.io/protocols/resumable-upload) that oml parses:
// pure functions, no I/O. The handlers (api/uploads_handlers.cc) apply them to requests.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "uploads/uploads.h"

namespace oml::uploads::tus {

inline constexpr char kVersion[] = "1.0.0";
inline constexpr char kExtensions[] = "creation,expiration,termination,checksum";
inline constexpr char kChecksumAlgorithms[] = "sha1,sha256";
inline constexpr char kOffsetContentType[] = "application/offset+octet-stream";

// Upload-Length / Upload-Offset: 1*DIGIT, a non-negative decimal integer of at most 18 digits
// (no sign, no spaces, no leading '+'). nullopt otherwise.
std::optional<uint64_t> ParseUint(std::string_view v);

// Upload-Metadata: comma-separated pairs "key SP base64(value)"; a key alone has an empty
// value. Keys are non-empty ASCII without spaces or commas, each at most once; values are
// standard base64 (RFC 4648 section 4, padded). Returns key -> decoded value.
// kInvalidArgument "invalid-upload-metadata" otherwise (the message names the key, never a value).
Result<std::map<std::string, std::string>> ParseMetadata(std::string_view header);

// Encodes `md` as an Upload-Metadata value (keys in map order).
std::string EncodeMetadata(const std::map<std::string, std::string>& md);

// What oml reads from the metadata of a creation (the rest is ignored):
//   sha256                 required: the SHA-256 of the whole file, the decoded value being its
//                          32 bytes or their 64 hex digits (stock clients send text values)
//   filename | name        optional: 1..255 characters of UTF-8 without control characters
//   content-type | filetype | type
//                          optional media type "type/subtype" (RFC 6838 restricted names) with
//                          optional parameters, printable ASCII, at most 255 characters;
//                          default application/octet-stream
// kInvalidArgument "invalid-upload-metadata" naming what is wrong.
Result<NewUpload> ParseCreation(uint64_t length, const std::map<std::string, std::string>& md);

// Upload-Checksum: "<algorithm> SP base64(digest)". Algorithms sha1 and sha256 (lower case);
// another algorithm is kInvalidArgument "unsupported-checksum-algorithm" (tus: 400); a
// malformed value or a digest of the wrong length kInvalidArgument "invalid-upload-checksum".
Result<Checksum> ParseChecksum(std::string_view header);

// An HTTP-date (RFC 9110 section 5.6.7, IMF-fixdate) of a Unix time in seconds.
std::string HttpDate(int64_t unix_seconds);

}  // namespace oml::uploads::tus
