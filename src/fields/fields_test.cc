// The field checks against the shared vectors (tests/data/field_vectors.json, also checked
// against docs/api/openapi.yaml by tests/test_docs.py), plus what JSON cannot carry: ill-formed
// UTF-8, and the exact messages.
#include "fields/fields.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace oml::fields {
namespace {

using Check = std::function<Status(std::string_view)>;

// Field name in the vector file -> its check and the name its messages start with.
const std::map<std::string, std::pair<Check, std::string>>& Checks() {
  static const auto* m = new std::map<std::string, std::pair<Check, std::string>>{
      {"workarea_id", {CheckWorkareaId, "workarea_id"}},
      {"path", {CheckPath, "path"}},
      {"provenance", {CheckProvenance, "provenance"}},
      {"simulation_id", {CheckSimulationId, "simulation_id"}},
      {"media_type", {CheckMediaType, "media_type"}},
      {"reason", {CheckReason, "reason"}},
      {"principal", {CheckPrincipal, "principal"}},
      {"tenant_name", {CheckTenantName, "tenant name"}},
  };
  return *m;
}

// A vector: a string, or {"prefix", "repeat", "count", "suffix"}.
std::string Expand(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  std::string s = v.value("prefix", "");
  const std::string rep = v.at("repeat").get<std::string>();
  for (int64_t i = 0, n = v.at("count").get<int64_t>(); i < n; ++i) s += rep;
  return s + v.value("suffix", "");
}

// For failure messages: long or binary vectors shortened and escaped.
std::string Show(const std::string& s) {
  std::string out = nlohmann::json(s.size() > 80 ? s.substr(0, 60) : s).dump(-1, ' ', false,
                                                                              nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) out += " ... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

nlohmann::json Vectors() {
  std::ifstream in(OML_FIELD_VECTORS);
  EXPECT_TRUE(in.good()) << "cannot open " << OML_FIELD_VECTORS;
  return nlohmann::json::parse(in);
}

TEST(FieldsTest, SharedVectors) {
  const nlohmann::json doc = Vectors();
  size_t checked = 0;
  std::vector<std::string> fields;
  for (const auto& [field, spec] : doc.at("fields").items()) {
    fields.push_back(field);
    auto it = Checks().find(field);
    ASSERT_NE(it, Checks().end()) << "no check for field " << field;
    const auto& [check, name] = it->second;
    for (const auto& v : spec.at("valid")) {
      const std::string s = Expand(v);
      const Status st = check(s);
      EXPECT_TRUE(st.ok()) << field << " " << Show(s) << ": " << st.ToString();
      ++checked;
    }
    for (const auto& v : spec.at("invalid")) {
      const std::string s = Expand(v);
      const Status st = check(s);
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << field << " " << Show(s);
      EXPECT_EQ(st.type(), "invalid-field") << field << " " << Show(s);
      EXPECT_EQ(st.message().rfind(name + " ", 0), 0u) << st.message();
      EXPECT_LT(st.message().size(), 200u) << "the message must not quote the value: " << Show(st.message());
      ++checked;
    }
  }
  // Every check is exercised by the file, and the file is not silently empty.
  std::vector<std::string> expected;
  for (const auto& [field, unused] : Checks()) expected.push_back(field);
  std::sort(fields.begin(), fields.end());
  EXPECT_EQ(fields, expected);
  EXPECT_GT(checked, 150u);
}

// The API reads "" as text/plain; the check itself refuses it (Claims never sees "").
TEST(FieldsTest, EmptyMediaTypeIsRefused) {
  EXPECT_EQ(CheckMediaType("").message(), "media_type must be 1..255 characters; it is empty");
}

TEST(FieldsTest, MessagesNameTheFieldAndTheRule) {
  const std::string huge(5 * 1024 * 1024, 'r');
  EXPECT_EQ(CheckReason(huge).message(), "reason must be 0..1024 characters; it has more");
  EXPECT_EQ(CheckMediaType("text/" + huge).message(), "media_type must be 1..255 characters; it has more");
  EXPECT_EQ(CheckMediaType("application/json").message(),
            "media_type must be a text/* type (bodies are stored as UTF-8 text)");
  EXPECT_EQ(CheckMediaType("text/" + std::string(128, 'a')).message(),
            "media_type type and subtype must be 1..127 characters each");
  EXPECT_EQ(CheckMediaType("text/plain;").message(),
            "media_type must be type/subtype with optional ; name=value parameters (RFC 6838 section 4.2, RFC 9110 "
            "section 8.3.1)");
  EXPECT_EQ(CheckMediaType("text/plain\r\n").message(),
            "media_type may not contain control characters (U+0000..U+001F, U+007F)");
  EXPECT_EQ(CheckMediaType("text/pla\xc3\xadn").message(), "media_type must be ASCII");
  EXPECT_EQ(CheckPath(std::string("a\0b", 3)).message(),
            "path may not contain control characters (U+0000..U+001F, U+007F)");
  EXPECT_EQ(CheckPath("").message(), "path must be 1..1024 characters; it is empty");
  EXPECT_EQ(CheckWorkareaId(std::string(201, 'w')).message(), "workarea_id must be 1..200 characters; it has more");
  EXPECT_EQ(CheckSimulationId("").message(), "simulation_id must be 1..200 characters; it is empty");
  EXPECT_EQ(CheckProvenance("rumor").message(), "provenance must be one of human, agent, tool, import");
  EXPECT_EQ(CheckPrincipal(std::string(201, 'p')).message(), "principal must be 1..200 characters; it has more");
  EXPECT_EQ(CheckTenantName("Acme").message(), "tenant name must match ^[a-z0-9][a-z0-9_-]{0,62}$");
  EXPECT_EQ(CheckWorkareaId("\xff").message(), "workarea_id must be UTF-8");
}

// Lengths are code points: 200 four-byte characters (800 bytes) are a valid workarea_id.
TEST(FieldsTest, LengthsCountCodePointsNotBytes) {
  std::string emoji;
  for (int i = 0; i < 200; ++i) emoji += "\xF0\x9F\x98\x80";
  EXPECT_TRUE(CheckWorkareaId(emoji).ok());
  EXPECT_FALSE(CheckWorkareaId(emoji + "\xF0\x9F\x98\x80").ok());
}

// Well-formed UTF-8 only (Unicode Table 3-7). JSON cannot carry these, so they are listed here;
// the CLI passes argv bytes through as they are.
TEST(FieldsTest, IllFormedUtf8IsRefusedInEveryTextField) {
  const std::vector<std::string> ill = {
      "\x80",              // lone continuation
      "\xbf",              // lone continuation
      "\xc0\xaf",          // overlong '/'
      "\xc1\xbf",          // overlong
      "\xe0\x80\xaf",      // overlong
      "\xe0\x9f\xbf",      // overlong (below U+0800)
      "\xed\xa0\x80",      // surrogate U+D800
      "\xed\xbf\xbf",      // surrogate U+DFFF
      "\xf0\x80\x80\xaf",  // overlong
      "\xf0\x8f\xbf\xbf",  // overlong (below U+10000)
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "\xf5\x80\x80\x80",  // lead byte F5
      "\xff",              // never valid
      "\xfe",              // never valid
      "\xe2\x82",          // truncated 3-byte sequence
      "\xf0\x9f\x98",      // truncated 4-byte sequence
      "\xc3",              // truncated 2-byte sequence
      "\xc3\x28",          // bad continuation
  };
  const std::vector<std::string> well = {
      "\xc2\x80",          // U+0080 (a C1 control: allowed)
      "\xdf\xbf",          // U+07FF
      "\xe0\xa0\x80",      // U+0800
      "\xed\x9f\xbf",      // U+D7FF
      "\xee\x80\x80",      // U+E000
      "\xef\xbf\xbf",      // U+FFFF
      "\xf0\x90\x80\x80",  // U+10000
      "\xf4\x8f\xbf\xbf",  // U+10FFFF
  };
  for (const char* field : {"workarea_id", "path", "simulation_id", "reason", "principal"}) {
    const auto& [check, name] = Checks().at(field);
    for (const auto& b : ill) {
      const Status st = check("a" + b + "b");
      EXPECT_EQ(st.message(), name + " must be UTF-8") << field << " " << Show(b);
      EXPECT_EQ(st.type(), "invalid-field");
    }
    for (const auto& w : well) EXPECT_TRUE(check("a" + w + "b").ok()) << field << " " << Show(w);
  }
}

}  // namespace
}  // namespace oml::fields
