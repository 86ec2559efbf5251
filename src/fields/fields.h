// Fields: the one definition of what a string that is signed into the journal may hold.
//
// Every string a client or operator supplies that ends up in a journal payload (and so, signed
// and append-only, in the outbox and the lake for ever) is checked here before anything is
// written: the claim metadata of POST /v1/claims, the erase reason, and the CLI's principal,
// tenant name and revoke reason. The HTTP API and the CLI reach the same checks through
// Claims::Submit / Claims::Erase and journal::CreateTenant / CreateApiKey / RevokeApiKey.
// docs/api/openapi.yaml states the same rules as maxLength / pattern / enum, and
// tests/data/field_vectors.json holds the vectors that both the C++ and the Python tests check
// (src/admission/fields_test.cc, tests/test_docs.py).
//
// Lengths are counted in characters, i.e. Unicode code points, as JSON Schema's maxLength
// counts them; every field must be well-formed UTF-8 (RFC 3629: no overlongs, surrogates or code
// points above U+10FFFF), so N characters are at most 4N bytes. "Control characters" are C0
// (U+0000..U+001F, tab and newline included) and DEL (U+007F); C1 controls and other code
// points pass (they are escaped or kept verbatim by RFC 8785 and harm nothing there).
//
// Every refusal is kInvalidArgument with problem type "invalid-field" (HTTP 400, CLI usage
// error) and a message that names the field and the rule. A message never quotes the value:
// it may be megabytes long or hold control characters.
//
// All functions are pure and thread-safe; a value is scanned at most once, stopping at the
// first violation (a too-long value is refused after its first limit+1 characters).
#pragma once

#include <cstddef>
#include <string_view>

#include "common/status.h"

namespace oml::fields {

inline constexpr const char* kInvalidField = "invalid-field";

// Limits, in characters (code points). media_type is ASCII only, so its limit is also in bytes.
inline constexpr size_t kMaxWorkareaId = 200;
inline constexpr size_t kMaxPath = 1024;
inline constexpr size_t kMaxSimulationId = 200;
inline constexpr size_t kMaxMediaType = 255;       // type "/" subtype [parameters]
inline constexpr size_t kMaxRestrictedName = 127;  // RFC 6838 §4.2: type and subtype each
inline constexpr size_t kMaxReason = 1024;
inline constexpr size_t kMaxPrincipal = 200;

// workarea_id: 1..200 characters, UTF-8, no control characters. Otherwise free text (slugs,
// non-ASCII names: existing clients use both).
[[nodiscard]] Status CheckWorkareaId(std::string_view v);
// path (the path at write): 1..1024 characters, UTF-8, no control characters.
[[nodiscard]] Status CheckPath(std::string_view v);
// provenance: exactly one of human, agent, tool, import.
[[nodiscard]] Status CheckProvenance(std::string_view v);
// simulation_id, when present: 1..200 characters, UTF-8, no control characters.
[[nodiscard]] Status CheckSimulationId(std::string_view v);
// media_type of an inline body, 1..255 ASCII characters:
//
//   media-type      = type "/" subtype *( *SP ";" *SP parameter )
//   type, subtype   = restricted-name                       ; RFC 6838 §4.2, 1..127 chars each
//   restricted-name = (ALPHA / DIGIT) *126( ALPHA / DIGIT / "!" / "#" / "$" / "&" / "-" /
//                                           "^" / "_" / "." / "+" )
//   parameter       = token "=" ( token / quoted-string )   ; RFC 9110 §5.6.2, §5.6.4, §5.6.6
//   quoted-string   = DQUOTE *( SP / %x21 / %x23-5B / %x5D-7E / "\" ( SP / VCHAR ) ) DQUOTE
//
// and the type is "text" (compared case-insensitively): bodies are stored inline as UTF-8 text.
// Stricter than RFC 9110 in three ways, so that what is signed stays plain: no HTAB (no
// control character at all), no empty parameter ("text/plain;" is refused), no obs-text (no
// byte above 0x7E). The value is stored as given (not lower-cased).
[[nodiscard]] Status CheckMediaType(std::string_view v);
// reason of an erasure or a key revocation: 0..1024 characters, UTF-8, no control characters.
// Empty means no reason.
[[nodiscard]] Status CheckReason(std::string_view v);
// description of a simulation (admission/lifecycle.h): 0..1024 characters, UTF-8, no control
// characters. Empty means none.
[[nodiscard]] Status CheckDescription(std::string_view v);
// principal of an API key (`oml key create --principal`): 1..200 characters, UTF-8, no control
// characters.
[[nodiscard]] Status CheckPrincipal(std::string_view v);
// tenant name: ^[a-z0-9][a-z0-9_-]{0,62}$ (also the CHECK on oml.tenants.name).
[[nodiscard]] Status CheckTenantName(std::string_view v);

}  // namespace oml::fields
