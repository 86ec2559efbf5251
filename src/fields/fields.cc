#include "fields/fields.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace oml::fields {
namespace {

Status Bad(std::string_view field, const std::string& rule) {
  return InvalidArgument(std::string(field) + " " + rule, kInvalidField);
}

// Decodes the code point at v[i] and advances i; false on ill-formed UTF-8 (RFC 3629 /
// Unicode Table 3-7: the well-formed byte sequences; no overlongs, surrogates or > U+10FFFF).
bool NextCodePoint(std::string_view v, size_t& i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(v[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) {
    cp = c;
    i += 1;
    return true;
  }
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;       // no overlongs
    if (c == 0xED) hi = 0x9F;       // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;       // no overlongs
    if (c == 0xF4) hi = 0x8F;       // nothing above U+10FFFF
  } else {
    return false;
  }
  if (i + len > v.size()) return false;
  for (int k = 1; k < len; ++k) {
    const unsigned char t = b(i + k);
    if (k == 1 ? (t < lo || t > hi) : (t < 0x80 || t > 0xBF)) return false;
    cp = (cp << 6) | (t & 0x3F);
  }
  i += len;
  return true;
}

bool IsControl(uint32_t cp) { return cp < 0x20 || cp == 0x7F; }

// The rule shared by the free-text fields: min..max code points of UTF-8, no control characters.
Status CheckText(std::string_view field, std::string_view v, size_t min, size_t max) {
  const std::string range = std::to_string(min) + ".." + std::to_string(max) + " characters";
  size_t i = 0, count = 0;
  while (i < v.size()) {
    if (count == max) return Bad(field, "must be " + range + "; it has more");
    uint32_t cp;
    if (!NextCodePoint(v, i, cp)) return Bad(field, "must be UTF-8");
    if (IsControl(cp)) return Bad(field, "may not contain control characters (U+0000..U+001F, U+007F)");
    ++count;
  }
  if (count < min) return Bad(field, "must be " + range + "; it is empty");
  return Status::Ok();
}

bool IsAlnum(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// RFC 6838 §4.2 restricted-name-chars.
bool IsRestrictedNameChar(unsigned char c) {
  return IsAlnum(c) || c == '!' || c == '#' || c == '$' || c == '&' || c == '-' || c == '^' || c == '_' || c == '.' ||
         c == '+';
}

// RFC 9110 §5.6.2 tchar.
bool IsTchar(unsigned char c) {
  return IsAlnum(c) || (c != 0 && std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos);
}

// RFC 9110 §5.6.4 qdtext without HTAB and obs-text.
bool IsQdtext(unsigned char c) { return c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5B) || (c >= 0x5D && c <= 0x7E); }

// Consumes a restricted-name at v[i]; its length, 0 if there is none.
size_t RestrictedName(std::string_view v, size_t& i) {
  const size_t start = i;
  if (i >= v.size() || !IsAlnum(static_cast<unsigned char>(v[i]))) return 0;
  ++i;
  while (i < v.size() && IsRestrictedNameChar(static_cast<unsigned char>(v[i]))) ++i;
  return i - start;
}

size_t Token(std::string_view v, size_t& i) {
  const size_t start = i;
  while (i < v.size() && IsTchar(static_cast<unsigned char>(v[i]))) ++i;
  return i - start;
}

bool QuotedString(std::string_view v, size_t& i) {
  if (i >= v.size() || v[i] != '"') return false;
  for (++i; i < v.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"') {
      ++i;
      return true;
    }
    if (c == '\\') {
      if (++i >= v.size()) return false;
      const unsigned char e = static_cast<unsigned char>(v[i]);
      if (e < 0x20 || e > 0x7E) return false;  // quoted-pair = "\" ( SP / VCHAR )
    } else if (!IsQdtext(c)) {
      return false;
    }
  }
  return false;  // unterminated
}

}  // namespace

Status CheckWorkareaId(std::string_view v) { return CheckText("workarea_id", v, 1, kMaxWorkareaId); }
Status CheckPath(std::string_view v) { return CheckText("path", v, 1, kMaxPath); }
Status CheckSimulationId(std::string_view v) { return CheckText("simulation_id", v, 1, kMaxSimulationId); }
Status CheckReason(std::string_view v) { return CheckText("reason", v, 0, kMaxReason); }
Status CheckDescription(std::string_view v) { return CheckText("description", v, 0, kMaxReason); }
Status CheckPrincipal(std::string_view v) { return CheckText("principal", v, 1, kMaxPrincipal); }

Status CheckProvenance(std::string_view v) {
  static constexpr std::string_view kProvenance[] = {"human", "agent", "tool", "import"};
  if (std::find(std::begin(kProvenance), std::end(kProvenance), v) == std::end(kProvenance))
    return Bad("provenance", "must be one of human, agent, tool, import");
  return Status::Ok();
}

Status CheckMediaType(std::string_view v) {
  static const std::string kSyntax =
      "must be type/subtype with optional ; name=value parameters (RFC 6838 section 4.2, RFC 9110 section 8.3.1)";
  if (v.empty()) return Bad("media_type", "must be 1.." + std::to_string(kMaxMediaType) + " characters; it is empty");
  if (v.size() > kMaxMediaType)
    return Bad("media_type", "must be 1.." + std::to_string(kMaxMediaType) + " characters; it has more");
  for (unsigned char c : v) {
    if (c < 0x20 || c == 0x7F) return Bad("media_type", "may not contain control characters (U+0000..U+001F, U+007F)");
    if (c > 0x7F) return Bad("media_type", "must be ASCII");
  }
  size_t i = 0;
  const size_t type_len = RestrictedName(v, i);
  if (type_len == 0 || i >= v.size() || v[i] != '/') return Bad("media_type", kSyntax);
  const std::string_view type = v.substr(0, type_len);
  ++i;
  const size_t subtype_len = RestrictedName(v, i);
  if (subtype_len == 0) return Bad("media_type", kSyntax);
  if (type_len > kMaxRestrictedName || subtype_len > kMaxRestrictedName)
    return Bad("media_type", "type and subtype must be 1.." + std::to_string(kMaxRestrictedName) + " characters each");
  // Parameters: each is *SP ";" *SP token "=" ( token / quoted-string ); nothing may trail.
  while (i < v.size()) {
    while (i < v.size() && v[i] == ' ') ++i;
    if (i >= v.size() || v[i] != ';') return Bad("media_type", kSyntax);
    ++i;
    while (i < v.size() && v[i] == ' ') ++i;
    if (Token(v, i) == 0 || i >= v.size() || v[i] != '=') return Bad("media_type", kSyntax);
    ++i;
    if (i < v.size() && v[i] == '"') {
      if (!QuotedString(v, i)) return Bad("media_type", kSyntax);
    } else if (Token(v, i) == 0) {
      return Bad("media_type", kSyntax);
    }
  }
  const auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c); };
  if (type.size() != 4 || !std::equal(type.begin(), type.end(), "text", [&](char a, char b) { return lower(a) == b; }))
    return Bad("media_type", "must be a text/* type (bodies are stored as UTF-8 text)");
  return Status::Ok();
}

Status CheckTenantName(std::string_view v) {
  const auto lower_alnum = [](unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  bool ok = !v.empty() && v.size() <= 63 && lower_alnum(static_cast<unsigned char>(v[0]));
  for (size_t i = 1; ok && i < v.size(); ++i)
    ok = lower_alnum(static_cast<unsigned char>(v[i])) || v[i] == '_' || v[i] == '-';
  if (!ok) return Bad("tenant name", "must match ^[a-z0-9][a-z0-9_-]{0,62}$");
  return Status::Ok();
}

}  // namespace oml::fields
