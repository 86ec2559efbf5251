// Canonical JSON: RFC 8785, the JSON Canonicalization Scheme (JCS).
//
// CanonicalizeRfc8785 implements the whole RFC:
//   - no insignificant whitespace;
//   - object members sorted by their names as arrays of UTF-16 code units (RFC 8785 §3.2.3).
//     This is not UTF-8 byte order: a name starting with a character above U+FFFF (a surrogate
//     pair, 0xD800..0xDBFF first) sorts *before* one starting with U+E000..U+FFFF;
//   - strings escaped as ECMAScript JSON.stringify does (§3.2.2.2): \" \\ \b \f \n \r \t,
//     other code points below U+0020 as \u00xx (lowercase hex), everything else literal UTF-8
//     (no escaping of "/", of U+007F, or of non-ASCII);
//   - numbers as ECMAScript Number.prototype.toString (§3.2.2.3): shortest round-trip digits,
//     plain digits while the decimal exponent is below 21 ("1e+21" from there), "0.00000d"
//     down to 1e-6 ("1e-7" below), -0 as "0"; NaN and Infinity are refused.
//
// Limits (all kInvalidArgument, message naming the offence):
//   - strings must be valid UTF-8 (no overlong forms, no encoded surrogates, nothing above
//     U+10FFFF): "string is not valid UTF-8 at byte N";
//   - integers must lie within ±2^53, where every integer is exactly an IEEE double:
//     "integer 9007199254740993 exceeds 2^53";
//   - arrays and objects nest at most kMaxCanonicalDepth levels deep (a value that is not an
//     array or object is at depth 0, "[]" is depth 1): "JSON nests deeper than 64 levels".
//     The serializer recurses once per level, so a planted document cannot exhaust the stack.
//
// Canonicalize is the subset oml signs (envelopes, signed heads): the same bytes, and in addition
// floating-point numbers and binary values are refused. Policy: no floats in signed JSON, so the
// number rules reduce to integer text.
//
// Byte layout of a canonical object (each member "name":value, names in UTF-16 order):
//
//   +---+--------+---+-------+---+-----+--------+---+-------+---+
//   | { | "name" | : | value | , | ... | "name" | : | value | } |
//   +---+--------+---+-------+---+-----+--------+---+-------+---+
//
// Thread safety: all functions are pure.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace oml::journal {

// Deepest nesting of arrays/objects accepted by the functions below. Signed envelopes nest
// three levels (envelope, refs, refs.provider).
inline constexpr int kMaxCanonicalDepth = 64;

// RFC 8785 canonical bytes of v: floats allowed. kInvalidArgument as listed above.
Result<std::string> CanonicalizeRfc8785(const nlohmann::json& v);

// Canonical bytes of v for signing: CanonicalizeRfc8785 restricted to objects, arrays, strings,
// integers, booleans and null. kInvalidArgument "floating-point numbers are not allowed in
// signed JSON" for a float anywhere in v, or as CanonicalizeRfc8785.
Result<std::string> Canonicalize(const nlohmann::json& v);

// Parses bytes and checks they are already canonical in the Canonicalize sense (byte-exact: member
// order by UTF-16 code units, escaping, no whitespace, no duplicate names). kDataLoss "signed
// bytes are not valid JSON" or "signed bytes are not canonical JSON" otherwise.
Result<nlohmann::json> ParseCanonical(const std::string& bytes);

// Parses one JSON text as RFC 8785 input (I-JSON, RFC 7493). kInvalidArgument if it is not JSON,
// repeats a member name within one object ("duplicate member name \"a\""), has an integer literal
// beyond ±2^53 (including literals too large for 64 bits, which a plain parse would silently turn
// into a double), or nests deeper than kMaxCanonicalDepth.
Result<nlohmann::json> ParseRfc8785Input(const std::string& text);

}  // namespace oml::journal
