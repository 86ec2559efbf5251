// Pure parts of `oml claim submit` (cli/claim_submit.h, cli/http_client.h). The end-to-end
// behaviour against a real server is tests/test_cli_submit.py.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "cli/claim_submit.h"
#include "cli/exit_codes.h"
#include "cli/http_client.h"
#include "crypto/crypto.h"
#include "uploads/tus.h"

namespace oml::cli {
namespace {

TEST(ServerUrl, ParsesHostAndPort) {
  auto u = ParseServerUrl("http://127.0.0.1:8470");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, "8470");
  EXPECT_EQ(u->base, "http://127.0.0.1:8470");
  u = ParseServerUrl("HTTP://oml.internal/");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "oml.internal");
  EXPECT_EQ(u->port, "80");
  EXPECT_EQ(u->base, "http://oml.internal:80");
  u = ParseServerUrl("http://[::1]:9000");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->base, "http://[::1]:9000");
}

TEST(ServerUrl, RefusesWhatItCannotSpeak) {
  for (const char* bad : {"https://oml.example.com", "ftp://x", "127.0.0.1:8470", "http://", "http://host:0",
                          "http://host:70000", "http://host:80/prefix", "http://u@host", "http://host:", "http://::1:80",
                          "http://host?x=1", "http://[::1"}) {
    auto u = ParseServerUrl(bad);
    ASSERT_FALSE(u.ok()) << bad;
    EXPECT_EQ(u.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(u.status().type(), "invalid-server-url") << bad;
  }
  EXPECT_NE(ParseServerUrl("https://x").status().message().find("plain HTTP"), std::string::npos);
}

TEST(ServerUrl, OfListenUsesLoopbackForWildcards) {
  EXPECT_EQ(ServerUrlOfListen("127.0.0.1:8470"), "http://127.0.0.1:8470");
  EXPECT_EQ(ServerUrlOfListen("0.0.0.0:8470"), "http://127.0.0.1:8470");
  EXPECT_EQ(ServerUrlOfListen("10.1.2.3:99"), "http://10.1.2.3:99");
}

TEST(MediaType, GuessedFromTheExtension) {
  EXPECT_EQ(GuessMediaType("notes.md"), "text/markdown");
  EXPECT_EQ(GuessMediaType("REPORT.PDF"), "application/pdf");
  EXPECT_EQ(GuessMediaType("a.tar.gz"), "application/gzip");
  EXPECT_EQ(GuessMediaType("data.json"), "application/json");
  EXPECT_EQ(GuessMediaType("photo.jpeg"), "image/jpeg");
  EXPECT_EQ(GuessMediaType("Makefile"), "application/octet-stream");
  EXPECT_EQ(GuessMediaType(".bashrc"), "application/octet-stream");
  EXPECT_EQ(GuessMediaType("x.unknownext"), "application/octet-stream");
}

// What the client declares is what the server's own parser (uploads/tus.h) reads back.
TEST(UploadMetadata, IsWhatTheServerParses) {
  const std::string sha = crypto::Sha256("hello");
  const std::string md = UploadMetadata(sha, "r\xc3\xa9sum\xc3\xa9 1.md", "text/markdown");
  auto parsed = uploads::tus::ParseMetadata(md);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  auto nu = uploads::tus::ParseCreation(5, *parsed);
  ASSERT_TRUE(nu.ok()) << nu.status().ToString();
  EXPECT_EQ(nu->plaintext_sha256, sha);
  EXPECT_EQ(nu->filename, "r\xc3\xa9sum\xc3\xa9 1.md");
  EXPECT_EQ(nu->media_type, "text/markdown");
  EXPECT_EQ(nu->length, 5u);
}

TEST(StateFile, NamedByServerKeyDigestAndSize) {
  const std::string sha = crypto::Sha256("file");
  const std::string a = StateFileName("http://127.0.0.1:1", "tok", sha, 4);
  EXPECT_EQ(a.size(), 64u + 5u);
  EXPECT_EQ(a.substr(64), ".json");
  EXPECT_EQ(a, StateFileName("http://127.0.0.1:1", "tok", sha, 4));
  EXPECT_NE(a, StateFileName("http://127.0.0.1:2", "tok", sha, 4));
  EXPECT_NE(a, StateFileName("http://127.0.0.1:1", "tok2", sha, 4));
  EXPECT_NE(a, StateFileName("http://127.0.0.1:1", "tok", crypto::Sha256("other"), 4));
  EXPECT_NE(a, StateFileName("http://127.0.0.1:1", "tok", sha, 5));
  EXPECT_EQ(a.find("tok"), std::string::npos);
}

TEST(StateFile, ClaimNamedByServerKeyRequestAndFiles) {
  const std::string a = crypto::Sha256("a"), b = crypto::Sha256("b");
  const std::string base = ClaimStateFileName("http://h:1", "tok", R"({"path":"p"})", {{a, 1}, {b, 2}});
  EXPECT_EQ(base.size(), 64u + 11u);
  EXPECT_EQ(base.substr(64), ".claim.json");
  EXPECT_EQ(base, ClaimStateFileName("http://h:1", "tok", R"({"path":"p"})", {{a, 1}, {b, 2}}));
  EXPECT_NE(base, ClaimStateFileName("http://h:2", "tok", R"({"path":"p"})", {{a, 1}, {b, 2}}));
  EXPECT_NE(base, ClaimStateFileName("http://h:1", "tok2", R"({"path":"p"})", {{a, 1}, {b, 2}}));
  EXPECT_NE(base, ClaimStateFileName("http://h:1", "tok", R"({"path":"q"})", {{a, 1}, {b, 2}}));
  EXPECT_NE(base, ClaimStateFileName("http://h:1", "tok", R"({"path":"p"})", {{b, 2}, {a, 1}}));  // order
  EXPECT_NE(base, ClaimStateFileName("http://h:1", "tok", R"({"path":"p"})", {{a, 1}}));
  EXPECT_NE(base, ClaimStateFileName("http://h:1", "tok", R"({"path":"p"})", {{a, 1}, {b, 3}}));
  // Not a collision with an upload's state file of the same inputs.
  EXPECT_NE(base.substr(0, 64), StateFileName("http://h:1", "tok", a, 1).substr(0, 64));
}

TEST(StateFile, DirectoryFollowsOmlHomeThenXdg) {
  ::setenv("OML_HOME", "/srv/oml", 1);
  EXPECT_EQ(StateDir(), "/srv/oml/uploads");
  ::unsetenv("OML_HOME");
  ::setenv("XDG_CACHE_HOME", "/home/u/.cache", 1);
  EXPECT_EQ(StateDir(), "/home/u/.cache/oml/uploads");
  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(StateDir(), "/home/u/.cache/oml/uploads");
}

TEST(Problems, MapToCodesAndExitCodes) {
  struct Case {
    int http;
    const char* slug;
    Code code;
    int exit;
  };
  const Case cases[] = {
      {400, "missing-field", Code::kInvalidArgument, kExitUsage},
      {401, "unauthenticated", Code::kUnauthenticated, kExitForbidden},
      {403, "forbidden-role", Code::kPermissionDenied, kExitForbidden},
      {404, "upload-not-found", Code::kNotFound, kExitNotFound},
      {409, "upload-busy", Code::kFailedPrecondition, kExitPrecondition},
      {410, "upload-expired", Code::kGone, kExitError},
      {413, "upload-too-large", Code::kPayloadTooLarge, kExitError},
      {422, "digest-mismatch", Code::kInvalidArgument, kExitUsage},
      {460, "checksum-mismatch", Code::kInvalidArgument, kExitUsage},
      {500, "integrity", Code::kDataLoss, kExitVerifyFailed},
      {500, "internal", Code::kInternal, kExitError},
      {503, "durability-reduced", Code::kUnavailable, kExitUnavailable},
  };
  for (const auto& c : cases) {
    const std::string body = std::string(R"({"type":"urn:oml:problem:)") + c.slug + R"(","detail":"why"})";
    Status s = StatusOfProblem(c.http, body, "PATCH /v1/uploads/x");
    EXPECT_EQ(s.code(), c.code) << c.http << " " << c.slug;
    EXPECT_EQ(s.type(), c.slug);
    EXPECT_EQ(s.message(), "why (HTTP " + std::to_string(c.http) + ", PATCH /v1/uploads/x)");
    EXPECT_EQ(ExitCodeFor(s), c.exit) << c.http << " " << c.slug;
  }
  // A HEAD answer has no body; a proxy's may not be JSON.
  Status s = StatusOfProblem(404, "", "HEAD /v1/uploads/x");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), "HTTP 404 (HEAD /v1/uploads/x)");
  s = StatusOfProblem(502, "<html>bad gateway</html>", "POST /v1/claims");
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(s.type(), "");
}

TEST(Backoff, DoublesToACapAndHonoursRetryAfter) {
  EXPECT_EQ(Backoff(1).count(), 500);
  EXPECT_EQ(Backoff(2).count(), 1000);
  EXPECT_EQ(Backoff(5).count(), 8000);
  EXPECT_EQ(Backoff(6).count(), 15000);
  EXPECT_EQ(Backoff(60).count(), 15000);
  EXPECT_EQ(Backoff(1, 3).count(), 3000);
}

}  // namespace
}  // namespace oml::cli
