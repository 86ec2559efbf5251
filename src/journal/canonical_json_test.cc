#include "journal/canonical_json.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "crypto/crypto.h"

namespace oml::journal {
namespace {

using nlohmann::json;

std::string Canon(const std::string& text) {
  auto r = Canonicalize(json::parse(text));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : "";
}

// RFC 8785 canonical bytes of a JSON text (floats allowed), or "error: <message>".
std::string Rfc(const std::string& text) {
  auto v = ParseRfc8785Input(text);
  if (!v.ok()) return "error: " + v.status().message();
  auto r = CanonicalizeRfc8785(*v);
  return r.ok() ? *r : "error: " + r.status().message();
}

std::string RfcOf(const json& v) {
  auto r = CanonicalizeRfc8785(v);
  return r.ok() ? *r : "error: " + r.status().message();
}

std::string Nested(const std::string& open, const std::string& close, int levels) {
  std::string s;
  for (int i = 0; i < levels; ++i) s += open;
  s += "0";
  for (int i = 0; i < levels; ++i) s += close;
  return s;
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

// Every code point below U+0020: the seven short escapes, the rest \u00xx in lowercase hex.
TEST(CanonicalJsonTest, EscapesEveryControlCharacter) {
  std::string in, want = "\"";
  for (int c = 0; c < 0x20; ++c) {
    in.push_back(static_cast<char>(c));
    switch (c) {
      case '\b': want += "\\b"; break;
      case '\t': want += "\\t"; break;
      case '\n': want += "\\n"; break;
      case '\f': want += "\\f"; break;
      case '\r': want += "\\r"; break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        want += buf;
      }
    }
  }
  want += "\"";
  EXPECT_EQ(RfcOf(json(in)), want);
  // Only C0 is escaped: U+007F and the C1 controls U+0080..U+009F stay literal.
  EXPECT_EQ(RfcOf(json(std::string("\x1f\x7f\xc2\x80\xc2\x9f"))), "\"\\u001f\x7f\xc2\x80\xc2\x9f\"");
}

// RFC 8785 §3.2.3, the sorting example in full: all seven names, the output in the RFC's order.
// By UTF-8 bytes (or code points) U+1F600 would sort after U+FB33; by UTF-16 code units its lead
// surrogate 0xD83D sorts before 0xFB33.
TEST(CanonicalJsonTest, Rfc8785Section323SortingExample) {
  const std::string input = R"json({
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
})json";
  const std::string want =
      "{\"\\r\":\"Carriage Return\","
      "\"1\":\"One\","
      "\"\u0080\":\"Control\","
      "\"\u00f6\":\"Latin Small Letter O With Diaeresis\","
      "\"\u20ac\":\"Euro Sign\","
      "\"\U0001F600\":\"Emoji: Grinning Face\","
      "\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}";
  EXPECT_EQ(Rfc(input), want);
  auto signed_subset = Canonicalize(json::parse(input));  // no numbers: the signing subset agrees
  ASSERT_TRUE(signed_subset.ok()) << signed_subset.status().ToString();
  EXPECT_EQ(*signed_subset, want);
}

// RFC 8785 §3.2.2 example (input as printed there) and its §3.2.4 UTF-8 bytes.
TEST(CanonicalJsonTest, Rfc8785Section322Example) {
  const std::string input = R"json({
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
})json";
  const std::string got = Rfc(input);
  EXPECT_EQ(got, R"({"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],)"
                 "\"string\":\"\u20ac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}");
  EXPECT_EQ(crypto::Hex(got),
            "7b226c69746572616c73223a5b6e756c6c2c747275652c66616c73655d2c226e"
            "756d62657273223a5b3333333333333333332e333333333333332c31652b3330"
            "2c342e352c302e3030322c31652d32375d2c22737472696e67223a22e282ac24"
            "5c75303030665c6e4127425c225c5c5c5c5c222f227d");
  // The signing subset refuses it: it has floats.
  auto r = Canonicalize(json::parse(input));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "floating-point numbers are not allowed in signed JSON");
}

// RFC 8785 Appendix B, every row: IEEE 754 bits -> ECMAScript text. NaN and Infinity have none.
TEST(CanonicalJsonTest, Rfc8785AppendixBNumberSerialization) {
  struct Row {
    uint64_t ieee;
    const char* want;  // nullptr: refused
  };
  const Row rows[] = {
      {0x0000000000000000, "0"},                          // zero
      {0x8000000000000000, "0"},                          // minus zero
      {0x0000000000000001, "5e-324"},                     // min pos number
      {0x8000000000000001, "-5e-324"},                    // min neg number
      {0x7fefffffffffffff, "1.7976931348623157e+308"},    // max pos number
      {0xffefffffffffffff, "-1.7976931348623157e+308"},   // max neg number
      {0x4340000000000000, "9007199254740992"},           // max pos int
      {0xc340000000000000, "-9007199254740992"},          // max neg int
      {0x4430000000000000, "295147905179352830000"},      // ~2**68
      {0x7fffffffffffffff, nullptr},                      // NaN
      {0x7ff0000000000000, nullptr},                      // Infinity
      {0x44b52d02c7e14af5, "9.999999999999997e+22"},
      {0x44b52d02c7e14af6, "1e+23"},
      {0x44b52d02c7e14af7, "1.0000000000000001e+23"},
      {0x444b1ae4d6e2ef4e, "999999999999999700000"},
      {0x444b1ae4d6e2ef4f, "999999999999999900000"},
      {0x444b1ae4d6e2ef50, "1e+21"},
      {0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
      {0x3eb0c6f7a0b5ed8d, "0.000001"},
      {0x41b3de4355555553, "333333333.3333332"},
      {0x41b3de4355555554, "333333333.33333325"},
      {0x41b3de4355555555, "333333333.3333333"},
      {0x41b3de4355555556, "333333333.3333334"},
      {0x41b3de4355555557, "333333333.33333343"},
      {0xbecbf647612f3696, "-0.0000033333333333333333"},
      {0x43143ff3c1cb0959, "1424953923781206.2"},         // round to even
  };
  EXPECT_EQ(std::size(rows), 26u);
  for (const Row& row : rows) {
    const double d = std::bit_cast<double>(row.ieee);
    SCOPED_TRACE(::testing::Message() << std::hex << row.ieee);
    if (row.want) {
      EXPECT_EQ(RfcOf(json(d)), row.want);
      EXPECT_EQ(RfcOf(json::array({d})), std::string("[") + row.want + "]");
    } else {
      EXPECT_EQ(RfcOf(json(d)),
                std::isnan(d) ? "error: NaN is not a JSON number" : "error: Infinity is not a JSON number");
    }
  }
  EXPECT_EQ(RfcOf(json(-std::numeric_limits<double>::infinity())), "error: Infinity is not a JSON number");
}

// The ECMAScript format boundaries: plain digits below 1e21, "0.00000d" down to 1e-6.
TEST(CanonicalJsonTest, NumberFormatBoundaries) {
  EXPECT_EQ(RfcOf(json(1e20)), "100000000000000000000");
  EXPECT_EQ(RfcOf(json(1e21)), "1e+21");
  EXPECT_EQ(RfcOf(json(1.5e21)), "1.5e+21");
  EXPECT_EQ(RfcOf(json(123456789012345680000.0)), "123456789012345680000");
  EXPECT_EQ(RfcOf(json(1e-6)), "0.000001");
  EXPECT_EQ(RfcOf(json(1.25e-6)), "0.00000125");
  EXPECT_EQ(RfcOf(json(1e-7)), "1e-7");
  EXPECT_EQ(RfcOf(json(-1.25e-7)), "-1.25e-7");
  EXPECT_EQ(RfcOf(json(0.5)), "0.5");
  EXPECT_EQ(RfcOf(json(56.0)), "56");
  EXPECT_EQ(RfcOf(json(-0.0)), "0");
  EXPECT_EQ(RfcOf(json(123.456)), "123.456");
}

// The reference implementation's test data (cyberphone/json-canonicalization testdata/input and
// testdata/outhex, as shipped with the PyPI package rfc8785 0.1.4): input text -> canonical bytes.
TEST(CanonicalJsonTest, ReferenceImplementationVectors) {
  struct Vector {
    const char* name;
    const char* input;
    const char* want_hex;
  };
  const Vector vectors[] = {
    {"arrays", R"json([
  56,
  {
    "d": true,
    "10": null,
    "1": [ ]
  }
])json",
     "5b35362c7b2231223a5b5d2c223130223a6e756c6c2c2264223a747275657d5d"},
    {"french", R"json({
  "peach": "This sorting order",
  "péché": "is wrong according to French",
  "pêche": "but canonicalization MUST",
  "sin":   "ignore locale"
})json",
     "7b227065616368223a225468697320736f7274696e67206f72646572222c2270c3a96368c3a9223a2269732077726f6e"
     "67206163636f7264696e6720746f204672656e6368222c2270c3aa636865223a226275742063616e6f6e6963616c697a"
     "6174696f6e204d555354222c2273696e223a2269676e6f7265206c6f63616c65227d"},
    {"structures", R"json({
  "1": {"f": {"f": "hi","F": 5} ,"\n": 56.0},
  "10": { },
  "": "empty",
  "a": { },
  "111": [ {"e": "yes","E": "no" } ],
  "A": { }
})json",
     "7b22223a22656d707479222c2231223a7b225c6e223a35362c2266223a7b2246223a352c2266223a226869227d7d2c22"
     "3130223a7b7d2c22313131223a5b7b2245223a226e6f222c2265223a22796573227d5d2c2241223a7b7d2c2261223a7b"
     "7d7d"},
    {"unicode", R"json({
  "Unnormalized Unicode":"A\u030a"
})json",
     "7b22556e6e6f726d616c697a656420556e69636f6465223a2241cc8a227d"},
    {"values", R"json({
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
})json",
     "7b226c69746572616c73223a5b6e756c6c2c747275652c66616c73655d2c226e756d62657273223a5b33333333333333"
     "33332e333333333333332c31652b33302c342e352c302e3030322c31652d32375d2c22737472696e67223a22e282ac24"
     "5c75303030665c6e4127425c225c5c5c5c5c222f227d"},
    {"weird", R"json({
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\u000a": "Newline",
  "1": "One",
  "\u0080": "Control\u007f",
  "\ud83d\ude02": "Smiley",
  "\u00f6": "Latin Small Letter O With Diaeresis",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "</script>": "Browser Challenge"
})json",
     "7b225c6e223a224e65776c696e65222c225c72223a2243617272696167652052657475726e222c2231223a224f6e6522"
     "2c223c2f7363726970743e223a2242726f77736572204368616c6c656e6765222c22c280223a22436f6e74726f6c7f22"
     "2c22c3b6223a224c6174696e20536d616c6c204c6574746572204f205769746820446961657265736973222c22e282ac"
     "223a224575726f205369676e222c22f09f9882223a22536d696c6579222c22efacb3223a22486562726577204c657474"
     "65722044616c6574205769746820446167657368227d"},
  };
  for (const Vector& v : vectors) {
    SCOPED_TRACE(v.name);
    EXPECT_EQ(crypto::Hex(Rfc(v.input)), v.want_hex) << Rfc(v.input);
  }
}

// Integers: exactly representable up to 2^53 (RFC 8785 §3.2.2.3 serializes them as doubles).
TEST(CanonicalJsonTest, RefusesIntegersBeyondTwoToThe53) {
  const int64_t two53 = int64_t{1} << 53;
  EXPECT_EQ(RfcOf(json(two53)), "9007199254740992");
  EXPECT_EQ(RfcOf(json(-two53)), "-9007199254740992");
  EXPECT_EQ(RfcOf(json(uint64_t{1} << 53)), "9007199254740992");
  EXPECT_EQ(RfcOf(json(two53 + 1)), "error: integer 9007199254740993 exceeds 2^53");
  EXPECT_EQ(RfcOf(json(-two53 - 1)), "error: integer -9007199254740993 exceeds 2^53");
  EXPECT_EQ(RfcOf(json((uint64_t{1} << 53) + 1)), "error: integer 9007199254740993 exceeds 2^53");
  EXPECT_EQ(RfcOf(json(std::numeric_limits<uint64_t>::max())), "error: integer 18446744073709551615 exceeds 2^53");
  EXPECT_EQ(RfcOf(json(std::numeric_limits<int64_t>::min())), "error: integer -9223372036854775808 exceeds 2^53");
  auto r = Canonicalize(json{{"seq", two53 + 1}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "integer 9007199254740993 exceeds 2^53");
  // From text: within 64 bits, and beyond (where a plain parse would round to a double).
  EXPECT_EQ(Rfc("[9007199254740993]"), "error: integer 9007199254740993 exceeds 2^53");
  EXPECT_EQ(Rfc("[-9007199254740993]"), "error: integer -9007199254740993 exceeds 2^53");
  EXPECT_EQ(Rfc("[18446744073709551616]"), "error: integer 18446744073709551616 exceeds 2^53");
  EXPECT_EQ(Rfc("[-99999999999999999999999]"), "error: integer -99999999999999999999999 exceeds 2^53");
  EXPECT_EQ(Rfc("[9007199254740992,-9007199254740992,-0]"), "[9007199254740992,-9007199254740992,0]");
  EXPECT_EQ(Rfc("[1e30]"), "[1e+30]");  // a float literal stays a float
}

TEST(CanonicalJsonTest, RefusesFloats) {
  auto r = Canonicalize(json::parse(R"({"a": 1.5})"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "floating-point numbers are not allowed in signed JSON");
  // A float that happens to be integral is still a float, and still refused when signing.
  auto integral = Canonicalize(json{{"a", json::array({1, 2.0})}});
  ASSERT_FALSE(integral.ok());
  EXPECT_EQ(integral.status().message(), "floating-point numbers are not allowed in signed JSON");
  // The full RFC accepts both.
  EXPECT_EQ(RfcOf(json::parse(R"({"a": 1.5})")), R"({"a":1.5})");
  EXPECT_EQ(RfcOf(json{{"a", json::array({1, 2.0})}}), R"({"a":[1,2]})");
}

TEST(CanonicalJsonTest, RefusesBinary) {
  auto r = Canonicalize(json::binary({1, 2}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "binary values are not allowed in signed JSON");
  EXPECT_EQ(RfcOf(json::binary({1, 2})), "error: binary values are not JSON");
}

TEST(CanonicalJsonTest, RefusesInvalidUtf8) {
  auto r = Canonicalize(json(std::string("\xff")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "string is not valid UTF-8 at byte 0");
  const std::pair<std::string, std::string> bad[] = {
      {"ab\xff", "2"},                 // not a lead byte
      {"a\x80", "1"},                  // stray continuation byte
      {"\xc0\xaf", "0"},               // overlong "/"
      {"\xe0\x80\xaf", "0"},           // overlong, three bytes
      {"\xed\xa0\x80", "0"},           // the surrogate U+D800, encoded
      {"\xed\xbf\xbf", "0"},           // the surrogate U+DFFF, encoded
      {"\xf4\x90\x80\x80", "0"},       // U+110000
      {"\xe2\x82", "0"},               // truncated
      {"\xf0\x9f\x98", "0"},           // truncated four-byte sequence
      {"x\xe2\x28\xa1", "1"},          // bad continuation
  };
  for (const auto& [s, at] : bad) {
    SCOPED_TRACE(crypto::Hex(s));
    EXPECT_EQ(RfcOf(json(s)), "error: string is not valid UTF-8 at byte " + at);
    EXPECT_EQ(RfcOf(json{{s, 1}}), "error: string is not valid UTF-8 at byte " + at);  // as a member name
  }
  // The edges that are valid: U+007F, U+0080, U+07FF, U+0800, U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF.
  const std::string edges =
      "\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf";
  EXPECT_EQ(RfcOf(json(edges)), "\"" + edges + "\"");
}

// Names that differ only above U+FFFF vs U+E000..U+FFFF: UTF-16 order is not byte order.
TEST(CanonicalJsonTest, SortsAstralBeforePrivateUseAndSpecials) {
  json j = {{"\ue000", 1}, {"\U00010000", 2}, {"\uffff", 3}, {"\U0010FFFF", 4}, {"\ud7ff", 5}, {"a", 6}, {"", 7}};
  EXPECT_EQ(RfcOf(j), "{\"\":7,\"a\":6,\"\ud7ff\":5,\"\U00010000\":2,\"\U0010FFFF\":4,\"\ue000\":1,\"\uffff\":3}");
  // Prefixes sort first, and comparison is per code unit, not per code point.
  json k = {{"\U0001F600", 1}, {"\U0001F600a", 2}, {"\U0001F601", 3}, {"\ufb33", 4}};
  EXPECT_EQ(RfcOf(k), "{\"\U0001F600\":1,\"\U0001F600a\":2,\"\U0001F601\":3,\"\ufb33\":4}");
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
  auto duplicate = ParseCanonical(R"({"a":1,"a":1})");
  EXPECT_EQ(duplicate.status().message(), "signed bytes are not canonical JSON");
  auto escaped = ParseCanonical(R"({"a":"\u00e9"})");  // must be literal UTF-8
  EXPECT_EQ(escaped.status().message(), "signed bytes are not canonical JSON");
  auto big = ParseCanonical(R"({"a":9007199254740993})");
  EXPECT_EQ(big.status().message(), "signed bytes are not canonical JSON");
  auto flt = ParseCanonical(R"({"a":1.5})");
  EXPECT_EQ(flt.status().message(), "signed bytes are not canonical JSON");
}

// The old serializer (nlohmann's std::map) wrote UTF-8 byte order; where UTF-16 order differs,
// those bytes are not canonical.
TEST(CanonicalJsonTest, ParseCanonicalRejectsByteOrderWhereUtf16OrderDiffers) {
  const std::string byte_order = "{\"\ufb33\":1,\"\U0001F600\":2}";
  const std::string utf16_order = "{\"\U0001F600\":2,\"\ufb33\":1}";
  auto bad = ParseCanonical(byte_order);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kDataLoss);
  EXPECT_EQ(bad.status().message(), "signed bytes are not canonical JSON");
  auto good = ParseCanonical(utf16_order);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ((*good)["\U0001F600"], 2);
}

TEST(CanonicalJsonTest, RefusesNestingDeeperThanTheLimit) {
  ASSERT_EQ(kMaxCanonicalDepth, 64);
  json deepest = 0, too_deep;
  for (int i = 0; i < 64; ++i) deepest = json::array({deepest});
  EXPECT_EQ(RfcOf(deepest), Nested("[", "]", 64));
  too_deep = json::array({deepest});
  EXPECT_EQ(RfcOf(too_deep), "error: JSON nests deeper than 64 levels");
  auto signing = Canonicalize(too_deep);
  ASSERT_FALSE(signing.ok());
  EXPECT_EQ(signing.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(signing.status().message(), "JSON nests deeper than 64 levels");
  json obj = 0;
  for (int i = 0; i < 64; ++i) obj = json{{"k", obj}};
  EXPECT_TRUE(CanonicalizeRfc8785(obj).ok());
  EXPECT_EQ(RfcOf(json{{"k", obj}}), "error: JSON nests deeper than 64 levels");
  // From text: refused while parsing; and a planted 200000-level document crashes nothing.
  EXPECT_EQ(Rfc(Nested("[", "]", 64)), Nested("[", "]", 64));
  EXPECT_EQ(Rfc(Nested("[", "]", 65)), "error: JSON nests deeper than 64 levels");
  EXPECT_EQ(Rfc(Nested("{\"a\":", "}", 65)), "error: JSON nests deeper than 64 levels");
  const std::string planted = Nested("[", "]", 200000);
  EXPECT_EQ(Rfc(planted), "error: JSON nests deeper than 64 levels");
  auto parsed = ParseCanonical(planted);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "signed bytes are not canonical JSON");
}

TEST(CanonicalJsonTest, ParseRfc8785InputRefusesWhatIJsonForbids) {
  EXPECT_EQ(Rfc(R"({"a":1,"b":{"a":2},"a":3})"), "error: duplicate member name \"a\"");
  EXPECT_EQ(Rfc("{\"\\n\":1,\"\\u000a\":2}"), "error: duplicate member name \"\\n\"");
  EXPECT_EQ(Rfc(R"({"a":1,"b":{"a":2}})"), R"({"a":1,"b":{"a":2}})");  // same name, different objects
  EXPECT_EQ(Rfc("[NaN]").rfind("error: not JSON: [json.exception.parse_error.101]", 0), 0u) << Rfc("[NaN]");
  EXPECT_EQ(Rfc("").rfind("error: not JSON: ", 0), 0u);
  EXPECT_EQ(Rfc("[1] x").rfind("error: not JSON: ", 0), 0u);
  EXPECT_EQ(Rfc("\"\\ud800\"").rfind("error: not JSON: ", 0), 0u);  // lone surrogate escape
  EXPECT_EQ(Rfc("\"\xff\"").rfind("error: not JSON: ", 0), 0u);
  EXPECT_EQ(Rfc("[1e400]").rfind("error: not JSON: ", 0), 0u);  // not a finite double
}

}  // namespace
}  // namespace oml::journal
