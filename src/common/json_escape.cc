#include "common/json_escape.h"

#include <cstdio>

namespace oml {

size_t JsonEscapedSize(std::string_view s) {
  size_t n = 0;
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\' || ch == '\b' || ch == '\f' || ch == '\n' || ch == '\r' || ch == '\t') n += 2;
    else if (ch < 0x20) n += 6;
    else n += 1;
  }
  return n;
}

void AppendJsonEscaped(std::string_view s, std::string* out) {
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (ch < 0x20) {
          char u[8];
          std::snprintf(u, sizeof u, "\\u%04x", ch);
          *out += u;
        } else {
          out->push_back(static_cast<char>(ch));
        }
    }
  }
}

std::string JsonEscaped(std::string_view s) {
  std::string out;
  out.reserve(JsonEscapedSize(s));
  AppendJsonEscaped(s, &out);
  return out;
}

}  // namespace oml
