#include "journal/canonical_json.h"

#include <gtest/gtest.h>

namespace oml::journal {
namespace {

using nlohmann::json;

std::string Canon(const std::string& text) {
  auto r = Canonicalize(json::parse(text));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : "";
}

TEST(CanonicalJsonTest, SortsMembersAndDropsWhitespace) {
  EXPECT_EQ(Canon(R"({ "b": 1, "a": [ true, null, "x" ], "c": { "z": 0, "y": -7 } })"),
            R"({"a":[true,null,"x"],"b":1,"c":{"y":-7,"z":0}})");
}

// RFC 8785 §3.2.2.2: string escaping as ECMAScript does it.
TEST(CanonicalJsonTest, EscapesLikeEcmaScript) {
  json j = std::string("\x01\b\t\n\f\r\"\\/\x7f") + "\xe2\x82\xac";
  auto r = Canonicalize(j);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "\"\\u0001\\b\\t\\n\\f\\r\\\"\\\\/\x7f\xe2\x82\xac\"");
}

// RFC 8785 §3.2.3 sorting example restricted to integer-free keys.
TEST(CanonicalJsonTest, SortsByCodeUnits) {
  json j = {{"\xe2\x82\xac", "Euro Sign"}, {"\r", "Carriage Return"}, {"1", "One"}, {"\xc3\xb6", "Latin Small Letter O With Diaeresis"}};
  auto r = Canonicalize(j);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xc3\xb6\":\"Latin Small Letter O With Diaeresis\","
                "\"\xe2\x82\xac\":\"Euro Sign\"}");
}

TEST(CanonicalJsonTest, RefusesFloats) {
  auto r = Canonicalize(json::parse(R"({"a": 1.5})"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "floating-point numbers are not allowed in signed JSON");
}

TEST(CanonicalJsonTest, RefusesInvalidUtf8) {
  auto r = Canonicalize(json(std::string("\xff")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
}

TEST(CanonicalJsonTest, ParseCanonicalRejectsNonCanonicalBytes) {
  EXPECT_TRUE(ParseCanonical(R"({"a":1,"b":2})").ok());
  auto spaced = ParseCanonical(R"({"a": 1,"b":2})");
  ASSERT_FALSE(spaced.ok());
  EXPECT_EQ(spaced.status().code(), Code::kDataLoss);
  EXPECT_EQ(spaced.status().message(), "signed bytes are not canonical JSON");
  auto unsorted = ParseCanonical(R"({"b":2,"a":1})");
  EXPECT_EQ(unsorted.status().message(), "signed bytes are not canonical JSON");
  auto broken = ParseCanonical(R"({"a":1)");
  EXPECT_EQ(broken.status().message(), "signed bytes are not valid JSON");
}

}  // namespace
}  // namespace oml::journal
