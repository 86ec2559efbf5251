#include "api/attachments_handlers.h"

#include <cctype>
#include <charconv>

#include "crypto/crypto.h"

namespace oml::api {
namespace {

Status BadRange(const std::string& why) {
  return Status(Code::kInvalidArgument, "Range " + why + "; one byte range is served (bytes=a-b, a- or -n)",
                "range-not-satisfiable");
}

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  for (char ch : s)
    if (ch < '0' || ch > '9') return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc();
}

// RFC 3986 unreserved characters pass; everything else is percent-encoded (RFC 8187 value-chars).
std::string Rfc8187(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' ||
        ch == '_' || ch == '~') {
      out.push_back(static_cast<char>(ch));
    } else {
      out.push_back('%');
      out.push_back(kHex[ch >> 4]);
      out.push_back(kHex[ch & 15]);
    }
  }
  return out;
}

}  // namespace

Result<std::optional<admission::ByteRange>> ParseRange(const http::Request& req) {
  const std::optional<admission::ByteRange> whole;
  if (req.HeaderCount("range") == 0) return whole;
  if (req.HeaderCount("range") > 1) return BadRange("is sent twice");
  std::string v = *req.Header("range");
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
  // RFC 9110 §14.2: a range unit the server does not know is ignored (the whole file, 200); a
  // request for several ranges may be answered with the whole file, which this server does.
  const size_t eq = v.find('=');
  if (eq == std::string::npos) return BadRange("has no range unit");
  std::string unit = v.substr(0, eq);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (unit != "bytes") return whole;
  const std::string spec = v.substr(eq + 1);
  if (spec.find(',') != std::string::npos) return whole;
  const size_t dash = spec.find('-');
  if (dash == std::string::npos) return BadRange("has no '-'");
  const std::string_view a = std::string_view(spec).substr(0, dash), b = std::string_view(spec).substr(dash + 1);
  admission::ByteRange r;
  if (a.empty()) {
    if (!ParseU64(b, &r.suffix_length) || r.suffix_length == 0) return BadRange("has a bad suffix length");
    return std::optional<admission::ByteRange>(r);
  }
  if (!ParseU64(a, &r.first)) return BadRange("has a bad first byte");
  if (!b.empty() && !ParseU64(b, &r.last)) return BadRange("has a bad last byte");
  if (r.last < r.first) return BadRange("ends before it starts");
  return std::optional<admission::ByteRange>(r);
}

void AttachmentResponse(const admission::ServedAttachment& s, http::Response& res) {
  res.status = s.partial ? 206 : 200;
  res.content_type = s.meta.media_type;
  res.SetHeader("Accept-Ranges", "bytes");
  res.SetHeader("Cache-Control", "private, no-store");
  res.SetHeader("X-Content-Type-Options", "nosniff");
  std::string disp = "attachment";
  if (!s.meta.filename.empty()) disp += "; filename*=UTF-8''" + Rfc8187(s.meta.filename);
  res.SetHeader("Content-Disposition", disp);
  if (s.partial) {
    const uint64_t last = s.first + s.length - 1;
    res.SetHeader("Content-Range", "bytes " + std::to_string(s.first) + "-" + std::to_string(last) + "/" +
                                       std::to_string(s.meta.size));
  }
  // The representation's digest, from the journal: known before a byte is read (RFC 9530).
  res.SetHeader("Repr-Digest", "sha-256=:" + crypto::Base64(s.meta.plaintext_sha256) + ":");
  res.stream = s.next;
  res.recycle = s.recycle;
  res.stream_length = s.length;
}

nlohmann::json AttachmentJson(const admission::Attachment& a) {
  return {{"ordinal", a.ordinal},
          {"filename", a.filename.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.filename)},
          {"media_type", a.media_type},
          {"size", a.size},
          {"plaintext_sha256", crypto::Hex(a.plaintext_sha256)},
          {"ciphertext_sha256", crypto::Hex(a.ciphertext_sha256)},
          {"location", a.location},
          {"flagged", a.flagged},
          {"review", a.review},
          {"attach_seq", a.attach_seq}};
}

}  // namespace oml::api
