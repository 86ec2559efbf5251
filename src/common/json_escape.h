// A string's bytes as nlohmann::json's dump writes them between the quotes (ensure_ascii off):
// '"' and '\\' escaped, \b \f \n \r \t, other bytes below 0x20 as \u00xx (lower-case hex),
// every other byte as is. Byte by byte, so a UTF-8 character split between two calls escapes
// the same: a streamed JSON string (GET /v1/claims/{id}) is escaped piece by piece. RFC 8785's
// string escaping is the same on well-formed text (journal/canonical_json.cc uses it).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace oml {

size_t JsonEscapedSize(std::string_view s);
std::string JsonEscaped(std::string_view s);
// Appends JsonEscaped(s) to *out.
void AppendJsonEscaped(std::string_view s, std::string* out);

}  // namespace oml
