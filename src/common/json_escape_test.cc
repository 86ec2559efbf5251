#include "common/json_escape.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

namespace oml {
namespace {

// The escaping equals nlohmann::json's own (the library that writes every other response), for
// every byte value and for random UTF-8 text cut at random points.
TEST(JsonEscapeTest, EqualsNlohmannForEveryByteAndAnySplit) {
  for (int b = 0; b < 0x80; ++b) {
    const std::string s(1, static_cast<char>(b));
    const std::string dumped = nlohmann::json(s).dump();
    EXPECT_EQ(JsonEscaped(s), dumped.substr(1, dumped.size() - 2)) << b;
    EXPECT_EQ(JsonEscapedSize(s), dumped.size() - 2) << b;
  }
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "\"", "\\", "\n", "\t", "\x01", "\x1f", "\x7f", "é", "€", "😀", "/", " "};
  for (int round = 0; round < 200; ++round) {
    std::string s;
    const int n = static_cast<int>(rng() % 300);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    const std::string dumped = nlohmann::json(s).dump();
    const std::string want = dumped.substr(1, dumped.size() - 2);
    const size_t cut = s.empty() ? 0 : rng() % s.size();  // may split a UTF-8 character
    EXPECT_EQ(JsonEscaped(s.substr(0, cut)) + JsonEscaped(s.substr(cut)), want);
    EXPECT_EQ(JsonEscapedSize(s.substr(0, cut)) + JsonEscapedSize(s.substr(cut)), want.size());
  }
}

}  // namespace
}  // namespace oml
