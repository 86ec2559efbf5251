// Canonical JSON (RFC 8785, JCS) for the subset oml signs: objects, arrays, strings, integers,
// booleans and null. Floating-point numbers are refused (kInvalidArgument), so the number
// serialization rules of JCS reduce to plain integer text.
//
// For this subset JCS is: no insignificant whitespace; object members sorted by key (UTF-16 code
// units; oml keys are ASCII, where that equals byte order); strings escaped as ECMAScript
// JSON.stringify does (\" \\ \b \f \n \r \t, other controls as \u00xx lowercase, everything else
// literal UTF-8). nlohmann::json stores objects in a std::map and dumps exactly that, which the
// RFC 8785 test vectors in canonical_json_test.cc pin down.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace oml::journal {

// Canonical bytes of v. kInvalidArgument if v holds a float or a string that is not UTF-8.
Result<std::string> Canonicalize(const nlohmann::json& v);

// Parses bytes and checks they are already canonical (byte-exact). kDataLoss otherwise.
Result<nlohmann::json> ParseCanonical(const std::string& bytes);

}  // namespace oml::journal
