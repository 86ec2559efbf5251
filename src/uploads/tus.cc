#include "uploads/tus.h"

#include <cctype>
#include <cstdio>
#include <ctime>
#include <initializer_list>
#include <regex>

#include "crypto/crypto.h"

namespace oml::uploads::tus {
namespace {

Status BadMetadata(const std::string& why) { return InvalidArgument("Upload-Metadata: " + why, "invalid-upload-metadata"); }

// Well-formed UTF-8 (RFC 3629: no overlongs, surrogates or code points above U+10FFFF) without
// C0 controls or DEL; returns the number of code points, or -1.
long Utf8CharsWithoutControls(std::string_view s) {
  long n = 0;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return -1;
      len = 1;
      cp = c;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return -1;
    }
    if (i + len > s.size()) return -1;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = s[i + k];
      if ((cc & 0xc0) != 0x80) return -1;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return -1;
    i += len;
    ++n;
  }
  return n;
}

const std::string* First(const std::map<std::string, std::string>& md, std::initializer_list<const char*> keys,
                         std::string* which) {
  for (const char* k : keys) {
    auto it = md.find(k);
    if (it != md.end()) {
      *which = k;
      return &it->second;
    }
  }
  return nullptr;
}

}  // namespace

std::optional<uint64_t> ParseUint(std::string_view v) {
  if (v.empty() || v.size() > 18) return std::nullopt;
  uint64_t x = 0;
  for (char ch : v) {
    if (ch < '0' || ch > '9') return std::nullopt;
    x = x * 10 + static_cast<uint64_t>(ch - '0');
  }
  return x;
}

Result<std::map<std::string, std::string>> ParseMetadata(std::string_view header) {
  std::map<std::string, std::string> out;
  if (header.find_first_not_of(" \t") == std::string_view::npos) return out;
  size_t b = 0;
  while (b <= header.size()) {
    size_t e = header.find(',', b);
    if (e == std::string_view::npos) e = header.size();
    std::string_view pair = header.substr(b, e - b);
    // Optional whitespace around each pair (clients join with "," or ", ").
    while (!pair.empty() && (pair.front() == ' ' || pair.front() == '\t')) pair.remove_prefix(1);
    while (!pair.empty() && (pair.back() == ' ' || pair.back() == '\t')) pair.remove_suffix(1);
    const size_t sp = pair.find(' ');
    const std::string key(pair.substr(0, sp));
    if (key.empty()) return BadMetadata("a pair has an empty key");
    for (unsigned char ch : key)
      if (ch <= 0x20 || ch >= 0x7f) return BadMetadata("keys are ASCII without spaces or commas");
    if (out.count(key)) return BadMetadata("key '" + key.substr(0, 64) + "' is given twice");
    std::string value;
    if (sp != std::string_view::npos) {
      std::string_view enc = pair.substr(sp + 1);
      auto dec = crypto::FromBase64(enc);
      if (!dec.ok()) return BadMetadata("the value of '" + key.substr(0, 64) + "' is not base64");
      value = std::move(dec).value();
    }
    out.emplace(key, std::move(value));
    b = e + 1;
  }
  return out;
}

std::string EncodeMetadata(const std::map<std::string, std::string>& md) {
  std::string out;
  for (const auto& [k, v] : md) {
    if (!out.empty()) out += ',';
    out += k;
    if (!v.empty()) out += ' ' + crypto::Base64(v);
  }
  return out;
}

Result<NewUpload> ParseCreation(uint64_t length, const std::map<std::string, std::string>& md) {
  NewUpload u;
  u.length = length;
  auto sha = md.find("sha256");
  if (sha == md.end())
    return BadMetadata("'sha256' is required: the SHA-256 of the whole file (its 32 bytes, or 64 hex digits), base64-encoded");
  if (sha->second.size() == 32) {
    u.plaintext_sha256 = sha->second;
  } else if (sha->second.size() == 64) {
    std::string lower = sha->second;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    auto raw = crypto::FromHex(lower);
    if (!raw.ok()) return BadMetadata("'sha256' of 64 characters must be hex digits");
    u.plaintext_sha256 = std::move(raw).value();
  } else {
    return BadMetadata("'sha256' must decode to the 32 bytes of a SHA-256 digest or its 64 hex digits");
  }
  std::string which;
  if (const std::string* name = First(md, {"filename", "name"}, &which)) {
    const long n = Utf8CharsWithoutControls(*name);
    if (n < 1 || n > 255) return BadMetadata("'" + which + "' must be 1..255 characters of UTF-8 without control characters");
    u.filename = *name;
  }
  if (const std::string* mt = First(md, {"content-type", "filetype", "type"}, &which)) {
    static const std::regex kMediaType(
        "^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}( *;[ -~]*)?$");
    if (mt->size() > 255 || !std::regex_match(*mt, kMediaType))
      return BadMetadata("'" + which + "' must be a media type type/subtype (RFC 6838) of printable ASCII, at most 255 characters");
    u.media_type = *mt;
  }
  return u;
}

Result<Checksum> ParseChecksum(std::string_view header) {
  const size_t sp = header.find(' ');
  if (sp == std::string_view::npos)
    return InvalidArgument("Upload-Checksum must be '<algorithm> <base64 digest>'", "invalid-upload-checksum");
  const std::string_view alg = header.substr(0, sp);
  Checksum c;
  size_t want = 0;
  if (alg == "sha1") {
    c.algorithm = ChecksumAlgorithm::kSha1;
    want = 20;
  } else if (alg == "sha256") {
    c.algorithm = ChecksumAlgorithm::kSha256;
    want = 32;
  } else {
    return InvalidArgument("Upload-Checksum algorithm '" + std::string(alg.substr(0, 32)) +
                               "' is not supported (Tus-Checksum-Algorithm: sha1,sha256)",
                           "unsupported-checksum-algorithm");
  }
  auto d = crypto::FromBase64(header.substr(sp + 1));
  if (!d.ok() || d->size() != want)
    return InvalidArgument("Upload-Checksum digest must be the base64 of " + std::to_string(want) + " bytes",
                           "invalid-upload-checksum");
  c.digest = std::move(d).value();
  return c;
}

std::string HttpDate(int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  static const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday], tm.tm_mday, kMonths[tm.tm_mon],
                tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return buf;
}

}  // namespace oml::uploads::tus
