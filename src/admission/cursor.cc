#include "admission/cursor.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

namespace oml::admission {
namespace {

using nlohmann::json;

Status BadCursor(const std::string& m) { return InvalidArgument(m, "invalid-cursor"); }

constexpr char kTagDomain[] = "oml-cursor/v2";  // with its terminating NUL in the MAC input

std::string MacInput(std::string_view signed_bytes) {
  std::string in(kTagDomain, sizeof kTagDomain);  // includes the 0x00
  in.append(signed_bytes);
  return in;
}

std::string Base64Url(std::string_view raw) {
  std::string s = crypto::Base64(raw);
  while (!s.empty() && s.back() == '=') s.pop_back();
  for (char& ch : s) ch = ch == '+' ? '-' : ch == '/' ? '_' : ch;
  return s;
}

std::optional<std::string> FromBase64Url(std::string s) {
  if (s.empty() || s.size() % 4 == 1) return std::nullopt;
  for (char& ch : s) {
    if (ch == '-') ch = '+';
    else if (ch == '_') ch = '/';
    else if (!std::isalnum(static_cast<unsigned char>(ch))) return std::nullopt;  // '+', '/', '=' too
  }
  while (s.size() % 4 != 0) s.push_back('=');
  auto raw = crypto::FromBase64(s);
  if (!raw.ok()) return std::nullopt;  // non-canonical unused bits too: one cursor, one spelling
  return std::move(raw).value();
}

// The canonical lowercase UUID form the server prints (claims.cc ValidUuid).
bool IsUuid(const std::string& s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string EncodeCursor(const crypto::HmacKeyRing& keys, const std::string& binding, const CursorPosition& p,
                         bool search) {
  json doc = {{"v", kCursorVersion}, {"q", binding}, {"s", p.seq}, {"a", p.artifact_id}};
  if (search) doc["r"] = p.rank;
  const std::string& id = keys.signing_key_id();  // 1..32 bytes (HmacKeyRing)
  std::string raw;
  raw.push_back(static_cast<char>(kCursorVersion));
  raw.push_back(static_cast<char>(id.size()));
  raw += id;
  raw += doc.dump();
  raw += keys.Sign(MacInput(raw));
  return Base64Url(raw);
}

Result<std::optional<CursorPosition>> DecodeCursor(const crypto::HmacKeyRing& keys, const std::string& cursor,
                                                   const std::string& binding, bool search) {
  if (cursor.empty()) return std::optional<CursorPosition>();
  if (cursor.size() > kMaxCursorChars) return BadCursor("cursor is not one this server issued (too long)");
  auto raw = FromBase64Url(cursor);
  if (!raw) return BadCursor("cursor is not base64url of a cursor");
  const std::string_view r(*raw);
  if (r.size() < 2 || static_cast<uint8_t>(r[0]) != kCursorVersion)
    return BadCursor("cursor is not one this server issued (unknown format)");
  const size_t id_len = static_cast<uint8_t>(r[1]);
  if (id_len == 0 || r.size() < 2 + id_len + crypto::kHmacSha256Size)
    return BadCursor("cursor is not one this server issued (truncated)");
  const std::string_view id = r.substr(2, id_len);
  const std::string_view signed_bytes = r.substr(0, r.size() - crypto::kHmacSha256Size);
  const std::string_view tag = r.substr(r.size() - crypto::kHmacSha256Size);
  if (!keys.Holds(id)) return BadCursor("cursor was issued under a key this server does not hold");
  if (!keys.Verify(id, MacInput(signed_bytes), tag)) return BadCursor("cursor was altered");

  // Authentic from here on: what follows can only fail for a cursor of another query, or if
  // the encoder changed without a new version.
  json doc = json::parse(signed_bytes.substr(2 + id_len), nullptr, /*allow_exceptions=*/false);
  const size_t members = search ? 5 : 4;
  if (!doc.is_object() || doc.size() != members || doc.value("v", json()) != json(kCursorVersion) ||
      !doc["q"].is_string() || !doc["s"].is_number_integer() || !doc["a"].is_string() ||
      (search && !doc["r"].is_string()))
    return BadCursor("cursor is not one this server issued");
  if (doc["q"].get<std::string>() != binding)
    return BadCursor("cursor belongs to another query (other filters, search text or endpoint)");
  CursorPosition p;
  p.seq = doc["s"].get<int64_t>();
  p.artifact_id = doc["a"].get<std::string>();
  if (p.seq < 1 || !IsUuid(p.artifact_id)) return BadCursor("cursor is not one this server issued");
  if (search) {
    p.rank = doc["r"].get<std::string>();
    char* end = nullptr;
    const double v = p.rank.empty() ? NAN : std::strtod(p.rank.c_str(), &end);
    if (p.rank.size() > 40 || p.rank.find_first_not_of("0123456789.eE+-") != std::string::npos ||
        end != p.rank.c_str() + p.rank.size() || !std::isfinite(v))
      return BadCursor("cursor is not one this server issued");
  }
  return std::optional<CursorPosition>(std::move(p));
}

}  // namespace oml::admission
