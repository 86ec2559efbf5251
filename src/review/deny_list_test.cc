#include "review/deny_list.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "common/temp_dir_testing.h"

namespace oml::review {

inline void PrintTo(const DenyHit& h, std::ostream* os) { *os << "{" << h.pattern_id << ", " << h.offset << "}"; }

namespace {

// Fake secrets with the right shape (AWS's documented example key pair, letters and digits).
const std::string kAwsKeyId = "AKIAIOSFODNN7EXAMPLE";
const std::string kAwsSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";  // 40 characters
const std::string k36 = "0123456789abcdefghijklmnopqrstuvwxyz";
const std::string kFinePat = "github_pat_" + std::string(22, 'A') + "_" + std::string(59, 'b');
const std::string kGoogle = "AIza" + std::string("Sy") + std::string(33, 'B');

std::vector<DenyHit> Hits(std::string_view text, size_t max_hits = 1000) {
  return DenyList::Builtin()->Scan(text, max_hits).hits;
}

TEST(DenyListTest, BuiltinIdsInDocumentedOrder) {
  std::vector<std::string> ids;
  for (const auto& p : DenyList::BuiltinPatterns()) ids.push_back(p.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"private-key-rsa", "private-key-ec", "private-key-openssh",
                                           "private-key-pgp", "private-key-pkcs8", "private-key-generic",
                                           "aws-access-key-id", "aws-secret-access-key", "github-token",
                                           "github-fine-grained-pat", "slack-token", "google-api-key"}));
}

// Each built-in pattern: one sample, found with its id at offset 5 ("see: " before it).
TEST(DenyListTest, EachBuiltinHitsWithItsIdAndOffset) {
  const std::pair<std::string, std::string> samples[] = {
      {"private-key-rsa", "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX\n-----END RSA PRIVATE KEY-----"},
      {"private-key-ec", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBYu\n-----END EC PRIVATE KEY-----"},
      {"private-key-openssh", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"},
      {"private-key-pgp", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n"},
      {"private-key-pkcs8", "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n"},
      {"private-key-pkcs8", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIFHDBOBgkq\n"},
      {"private-key-generic", "-----BEGIN DSA PRIVATE KEY-----\nMIIBuwIBAAKBgQ\n"},
      {"private-key-generic", "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: x\n"},
      {"aws-access-key-id", kAwsKeyId},
      {"aws-access-key-id", "ASIAY34FZKBOKMUTVV7A"},
      {"aws-secret-access-key", "aws_secret_access_key = " + kAwsSecret},
      {"aws-secret-access-key", "AWS_SECRET_ACCESS_KEY=\"" + kAwsSecret + "\""},
      {"aws-secret-access-key", "aws-secret-key => '" + kAwsSecret + "'"},
      {"aws-secret-access-key", "Aws_Secret_Access_Key\": \"" + kAwsSecret + "\""},
      {"github-token", "ghp_" + k36},
      {"github-token", "gho_" + k36},
      {"github-token", "ghs_" + k36},
      {"github-fine-grained-pat", kFinePat},
      {"slack-token", "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp"},
      {"slack-token", "xoxp-1234567890"},
      {"google-api-key", kGoogle},
  };
  for (const auto& [id, sample] : samples) {
    const std::string text = "see: " + sample + " end\n";
    EXPECT_EQ(Hits(text), (std::vector<DenyHit>{{id, 5}})) << sample;
  }
}

TEST(DenyListTest, NearMissesDoNotHit) {
  const std::string near_misses[] = {
      "AKIAIOSFODNN7EXAMPL",                 // AKIA + 15
      "AKIAIOSFODNN7EXAMPLEX",               // AKIA + 17: not a whole word of the right length
      "XAKIAIOSFODNN7EXAMPLE",               // glued to a preceding word
      "akiaiosfodnn7example",                // lower case
      "ABIAIOSFODNN7EXAMPLE",                // no such prefix
      "AKIAiosfodnn7EXAMPLE",                // lower-case letters inside
      "aws_secret_access_key = " + kAwsSecret.substr(1),          // 39 characters
      "aws_secret_access_key = " + kAwsSecret + "Z",              // 41 characters
      "aws_secret_access_key = ${AWS_SECRET}",                    // a placeholder
      kAwsSecret,                                                 // 40 characters, unnamed
      "ghp_" + k36.substr(1),                // 35
      "ghp_" + k36 + "x",                    // 37
      "ghx_" + k36,                          // no such prefix
      "github_pat_" + std::string(21, 'A') + "_" + std::string(59, 'b'),
      "xoxc-1234567890-0987654321",          // not a b/a/p/r token
      "xoxb-12345",                          // too short
      "AIza" + std::string(34, 'B'),         // AIza + 34
      "-----BEGIN RSA PUBLIC KEY-----",
      "-----BEGIN PUBLIC KEY-----",
      "-----BEGIN CERTIFICATE-----",
      "BEGIN RSA PRIVATE KEY",               // prose, not armour
      "-----END RSA PRIVATE KEY-----",
  };
  for (const auto& text : near_misses) EXPECT_EQ(Hits("see: " + text + " end\n"), std::vector<DenyHit>{}) << text;
}

TEST(DenyListTest, SpecificKeyPatternsHideTheGenericOne) {
  const std::string text = "a\n-----BEGIN RSA PRIVATE KEY-----\nb\n------BEGIN EC PRIVATE KEY-----\n";
  EXPECT_EQ(Hits(text), (std::vector<DenyHit>{{"private-key-rsa", 2}, {"private-key-ec", 37}}));
}

TEST(DenyListTest, HitsAreOrderedByOffsetAndCapped) {
  const std::string text = "ghp_" + k36 + " " + kAwsKeyId + "\n" + kAwsKeyId + " " + kAwsKeyId;
  const uint64_t a = 41, b = a + 21, c = b + 21;
  EXPECT_EQ(Hits(text), (std::vector<DenyHit>{{"github-token", 0}, {"aws-access-key-id", a},
                                              {"aws-access-key-id", b}, {"aws-access-key-id", c}}));
  ScanHits capped = DenyList::Builtin()->Scan(text, 2);
  EXPECT_EQ(capped.hits, (std::vector<DenyHit>{{"github-token", 0}, {"aws-access-key-id", a}}));
  EXPECT_TRUE(capped.truncated);
  EXPECT_FALSE(DenyList::Builtin()->Scan(text, 4).truncated);
}

TEST(DenyListTest, ScanIsDeterministicAndLinearOnHostileText) {
  // A text that makes a backtracking engine crawl on "-{4,5} ?BEGIN [A-Z0-9 ]{0,64}PRIVATE KEY".
  std::string hostile;
  for (int i = 0; i < 20000; ++i) hostile += "----- BEGIN AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA PRIVATE KE";
  hostile += " " + kAwsKeyId;
  const auto first = Hits(hostile);
  EXPECT_EQ(first, (std::vector<DenyHit>{{"aws-access-key-id", hostile.size() - kAwsKeyId.size()}}));
  EXPECT_EQ(Hits(hostile), first);
}

TEST(DenyListTest, CompileRefusesBadPatterns) {
  auto bad = [](std::vector<DenyPattern> ps) {
    auto r = DenyList::Compile(std::move(ps));
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_EQ(bad({{"Upper", "x"}}), "deny-list pattern id 'Upper': must match [a-z0-9][a-z0-9._-]{0,63}");
  EXPECT_EQ(bad({{"-lead", "x"}}), "deny-list pattern id '-lead': must match [a-z0-9][a-z0-9._-]{0,63}");
  EXPECT_EQ(bad({{"a", "x"}, {"a", "y"}}), "deny-list pattern id 'a' appears twice");
  EXPECT_EQ(bad({{"a", "(unclosed"}}), "deny-list pattern 'a': missing ): (unclosed");
  EXPECT_EQ(bad({{"a", "x*"}}), "deny-list pattern 'a' matches the empty string");
  EXPECT_EQ(bad({{"a", "(a)\\1"}}), "deny-list pattern 'a': invalid escape sequence: \\1");  // no backreferences
}

TEST(DenyListTest, ParseTheFileFormat) {
  auto r = DenyList::Parse(R"(
disable = ["aws-secret-access-key", "slack-token"]
[[pattern]]
id = "acme-deploy-token"
regex = '''acme_[0-9a-f]{8}'''
[[pattern]]
id = "acme-any"
regex = 'acme_\w+'
fallback = true
)", "deny.toml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), DenyList::BuiltinPatterns().size() - 2 + 2);
  EXPECT_EQ(r->at(r->size() - 2).id, "acme-deploy-token");
  EXPECT_EQ(r->back().regex, "acme_\\w+");
  EXPECT_TRUE(r->back().fallback);
  for (const auto& p : *r) EXPECT_NE(p.id, "slack-token");
  auto list = DenyList::Compile(*r);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ((*list)->Scan("x acme_0123abcd acme_zz xoxb-1234567890").hits,
            (std::vector<DenyHit>{{"acme-deploy-token", 2}, {"acme-any", 16}}));

  auto own = DenyList::Parse("builtin = false\n[[pattern]]\nid = \"only\"\nregex = \"only\"\n", "f");
  ASSERT_TRUE(own.ok());
  ASSERT_EQ(own->size(), 1u);
  EXPECT_EQ(own->front().id, "only");
  auto none = DenyList::Parse("", "f");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->size(), DenyList::BuiltinPatterns().size());
}

TEST(DenyListTest, ParseRefusesMalformedFiles) {
  auto msg = [](std::string_view text) {
    auto r = DenyList::Parse(text, "deny.toml");
    EXPECT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.ok() ? Code::kOk : r.status().code(), Code::kInvalidArgument);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_EQ(msg("colour = 1\n"), "deny.toml: unknown key 'colour'");
  EXPECT_EQ(msg("builtin = 1\n"), "deny.toml: builtin must be true or false");
  EXPECT_EQ(msg("disable = [1]\n"), "deny.toml: disable must be an array of built-in pattern ids");
  EXPECT_EQ(msg("[[pattern]]\nid = 1\nregex = \"b\"\n"),
            "deny.toml: [[pattern]] id: unknown key or wrong type (id and regex are strings, fallback a boolean)");
  EXPECT_EQ(msg("[[pattern]]\nid = \"a\"\nregex = \"b\"\nfallback = 1\n"),
            "deny.toml: [[pattern]] fallback: unknown key or wrong type (id and regex are strings, fallback a boolean)");
  EXPECT_EQ(msg("disable = [\"nope\"]\n"), "deny.toml: disable: 'nope' is not a built-in pattern id");
  EXPECT_EQ(msg("builtin = false\ndisable = [\"slack-token\"]\n"), "deny.toml: disable has no effect with builtin = false");
  EXPECT_EQ(msg("[[pattern]]\nid = \"a\"\n"), "deny.toml: every [[pattern]] needs an id and a regex");
  EXPECT_EQ(msg("[[pattern]]\nid = \"a\"\nregex = \"b\"\nflags = \"i\"\n"),
            "deny.toml: [[pattern]] flags: unknown key or wrong type (id and regex are strings, fallback a boolean)");
  EXPECT_EQ(msg("pattern = 3\n"), "deny.toml: pattern must be an array of tables ([[pattern]])");
  EXPECT_TRUE(msg("[[pattern\n").starts_with("deny.toml: "));
}

TEST(DenyListTest, LoadReadsTheFileOrUsesTheBuiltins) {
  auto builtin = DenyList::Load("");
  ASSERT_TRUE(builtin.ok());
  EXPECT_EQ(builtin->get(), DenyList::Builtin().get());

  oml::testing::ScopedTempDir dir("oml-deny");
  auto missing = DenyList::Load((dir.path() / "none.toml").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);

  const auto path = (dir.path() / "deny.toml").string();
  std::ofstream(path) << "builtin = false\n[[pattern]]\nid = \"codename\"\nregex = '(?i)project bluebird'\n";
  auto list = DenyList::Load(path);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ((*list)->Scan("About Project Bluebird and " + kAwsKeyId).hits, (std::vector<DenyHit>{{"codename", 6}}));

  std::ofstream(path) << "[[pattern]]\nid = \"aws-access-key-id\"\nregex = 'x'\n";
  auto dup = DenyList::Load(path);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().message(), "deny-list pattern id 'aws-access-key-id' appears twice");
}

// The windowed scan finds what the whole scan finds: random texts dense with secrets, near
// misses and word boundaries, fed in random pieces, with windows as small as 1 byte (the
// overlap is the bound of a match's length: 200 covers every built-in match here).
TEST(DenyScannerTest, WindowsFindExactlyWhatTheWholeScanFinds) {
  const std::vector<std::string> parts = {
      kAwsKeyId, "AKIA", "x" + kAwsKeyId, "aws_secret_access_key = " + kAwsSecret, "ghp_" + k36, kFinePat,
      kGoogle, "xoxb-1234567890-abc", "-----BEGIN RSA PRIVATE KEY-----", "-----BEGIN DSA PRIVATE KEY-----",
      " ", "\n", "ab", "Z", "0", "-", "=", "/", "\xC3\xA9"};
  std::mt19937 rng(20261204);
  for (int round = 0; round < 200; ++round) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
    const ScanHits want = DenyList::Builtin()->Scan(text);
    for (size_t window : {size_t{1}, size_t{7}, size_t{64}, size_t{4096}}) {
      DenyScanner scanner(DenyList::Builtin(), 1000, window, 200);
      size_t at = 0;
      while (at < text.size()) {
        const size_t k = std::min<size_t>(text.size() - at, rng() % 50);
        scanner.Text(std::string_view(text).substr(at, k));
        at += k;
      }
      const ScanHits got = scanner.Finish();
      SCOPED_TRACE("round " + std::to_string(round) + ", window " + std::to_string(window));
      EXPECT_EQ(got.hits, want.hits);
      EXPECT_EQ(got.truncated, want.truncated);
      EXPECT_EQ(scanner.bytes(), text.size());
    }
  }
}

// A window's end is not the text's end: $, \z and \b there see the next byte (a pattern whose
// preferred alternative needs the end of the text must not match at a window's end).
TEST(DenyScannerTest, AWindowsEndIsNotTheEndOfTheText) {
  auto list = DenyList::Compile({{"foo-end", R"(foo.*\z|foo)", false}, {"word", R"(\bbar\b)", false}});
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  std::string text;
  for (int i = 0; i < 100; ++i) text += "foo barbar bar ";
  text += "\n";
  const ScanHits want = (*list)->Scan(text);
  EXPECT_EQ(want.hits.size(), 200u);
  for (size_t window : {size_t{1}, size_t{5}, size_t{64}}) {
    DenyScanner scanner(*list, 1000, window, 16);
    for (size_t at = 0; at < text.size(); at += 7) scanner.Text(std::string_view(text).substr(at, 7));
    EXPECT_EQ(scanner.Finish().hits, want.hits) << window;
  }
}

TEST(DenyScannerTest, MaxHitsAcrossWindows) {
  std::string text;
  for (int i = 0; i < 30; ++i) text += kAwsKeyId + " ";
  DenyScanner scanner(DenyList::Builtin(), 25, 16, 64);
  scanner.Text(text);
  const ScanHits got = scanner.Finish();
  EXPECT_EQ(got.hits.size(), 25u);
  EXPECT_TRUE(got.truncated);
  EXPECT_EQ(got.hits.back().offset, 24 * (kAwsKeyId.size() + 1));
  EXPECT_EQ(got.hits, DenyList::Builtin()->Scan(text, 25).hits);
}

}  // namespace
}  // namespace oml::review
