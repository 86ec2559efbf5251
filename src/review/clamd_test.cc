#include "review/clamd.h"

#include <gtest/gtest.h>

#include <chrono>

#include "common/temp_dir_testing.h"
#include "review/clamd_testing.h"

namespace oml::review {
namespace {

using testing::FakeClamd;
using Outcome = ScanResult::Outcome;

std::string Payload(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 7) & 0xFF);
  return s;
}

TEST(ClamdTest, CleanStreamIsSentInChunksAndReportedClean) {
  FakeClamd server(FakeClamd::Mode::kClean);
  const std::string data = Payload(200 * 1024);
  ScanResult r = ClamdScan(server.address(), data, 5000);
  EXPECT_EQ(r, (ScanResult{Outcome::kClean, ""}));
  EXPECT_EQ(r.ToString(), "clean");
  auto sessions = server.sessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].command, std::string("zINSTREAM\0", 10));
  EXPECT_EQ(sessions[0].data, data);
  EXPECT_EQ(sessions[0].chunk_sizes, (std::vector<uint32_t>{65536, 65536, 65536, 8192}));
  EXPECT_TRUE(sessions[0].ended);
}

TEST(ClamdTest, EmptyStreamIsJustTheTerminator) {
  FakeClamd server(FakeClamd::Mode::kClean);
  EXPECT_EQ(ClamdScan(server.address(), "", 5000).outcome, Outcome::kClean);
  auto sessions = server.sessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_TRUE(sessions[0].chunk_sizes.empty());
  EXPECT_TRUE(sessions[0].ended);
}

TEST(ClamdTest, FoundIsInfectedWithTheSignature) {
  FakeClamd server(FakeClamd::Mode::kFound);
  ScanResult r = ClamdScan(server.address(), "X5O!P%@AP[4\\PZX54(P^)7CC)7}$EICAR", 5000);
  EXPECT_EQ(r, (ScanResult{Outcome::kInfected, "Eicar-Test-Signature"}));
  EXPECT_EQ(r.ToString(), "infected: Eicar-Test-Signature");
}

TEST(ClamdTest, StreamingWritesOverAUnixSocket) {
  oml::testing::ScopedTempDir dir("oml-clamd");
  FakeClamd server(FakeClamd::Mode::kFound, (dir.path() / "clamd.sock").string());
  server.signature = "Win.Test.EICAR_HDB-1";
  auto s = ClamdStream::Open(server.address(), 5000);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->Write("part one, ").ok());
  ASSERT_TRUE(s->Write("part two").ok());
  EXPECT_EQ(s->Finish(), (ScanResult{Outcome::kInfected, "Win.Test.EICAR_HDB-1"}));
  auto sessions = server.sessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].data, "part one, part two");
  EXPECT_EQ(sessions[0].chunk_sizes, (std::vector<uint32_t>{10, 8}));
}

TEST(ClamdTest, ClosedConnectionWithoutAnswerIsAnError) {
  FakeClamd server(FakeClamd::Mode::kCloseNoAnswer);
  ScanResult r = ClamdScan(server.address(), "abc", 5000);
  EXPECT_EQ(r, (ScanResult{Outcome::kError, "clamd closed the connection without an answer"}));
  EXPECT_EQ(r.ToString(), "error: clamd closed the connection without an answer");
}

TEST(ClamdTest, AnAnswerBeforeTheEndOfTheStreamIsRead) {
  FakeClamd server(FakeClamd::Mode::kSizeLimit);
  server.limit_bytes = 64 * 1024;
  ScanResult r = ClamdScan(server.address(), Payload(4 << 20), 5000);
  EXPECT_EQ(r, (ScanResult{Outcome::kError, "clamd: INSTREAM size limit exceeded. ERROR"}));
}

TEST(ClamdTest, NoAnswerWithinTheTimeoutIsAnError) {
  FakeClamd server(FakeClamd::Mode::kSilent);
  const auto t0 = std::chrono::steady_clock::now();
  ScanResult r = ClamdScan(server.address(), "abc", 200);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r, (ScanResult{Outcome::kError, "clamd: waiting for the answer: Connection timed out"}));
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 3000);
}

TEST(ClamdTest, NobodyListeningIsAnError) {
  std::string address;
  {
    FakeClamd gone(FakeClamd::Mode::kClean);  // a port that was just free, closed again
    address = gone.address();
  }
  ScanResult r = ClamdScan(address, "abc", 2000);
  EXPECT_EQ(r, (ScanResult{Outcome::kError, "clamd: connect: Connection refused"}));
  oml::testing::ScopedTempDir dir("oml-clamd");
  r = ClamdScan("unix:" + (dir.path() / "none.sock").string(), "abc", 2000);
  EXPECT_EQ(r, (ScanResult{Outcome::kError, "clamd: connect: No such file or directory"}));
}

TEST(ClamdTest, NotConfiguredWithoutAnAddress) {
  ScanResult r = ClamdScan("", "abc", 2000);
  EXPECT_EQ(r.outcome, Outcome::kNotConfigured);
  EXPECT_EQ(r.ToString(), "not-configured");
}

TEST(ClamdTest, ParseAddress) {
  auto a = ParseClamdAddress("unix:/run/clamav/clamd.ctl");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->unix_socket);
  EXPECT_EQ(a->path, "/run/clamav/clamd.ctl");
  a = ParseClamdAddress("/tmp/c.sock");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->path, "/tmp/c.sock");
  a = ParseClamdAddress("tcp:clamav.internal:3310");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->unix_socket);
  EXPECT_EQ(a->host, "clamav.internal");
  EXPECT_EQ(a->port, "3310");
  a = ParseClamdAddress("[::1]:3310");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, "3310");
  for (const char* bad : {"", "clamav", ":3310", "host:", "host:port", "host:70000", "[::1]3310", "unix:"}) {
    auto r = ParseClamdAddress(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.ok() ? Code::kOk : r.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(ClamdTest, ParseReply) {
  EXPECT_EQ(ParseClamdReply("stream: OK"), (ScanResult{Outcome::kClean, ""}));
  EXPECT_EQ(ParseClamdReply("stream: OK\n"), (ScanResult{Outcome::kClean, ""}));
  EXPECT_EQ(ParseClamdReply("stream: Eicar-Signature FOUND"), (ScanResult{Outcome::kInfected, "Eicar-Signature"}));
  EXPECT_EQ(ParseClamdReply("stream:  FOUND"), (ScanResult{Outcome::kError, "clamd: stream:  FOUND"}));
  EXPECT_EQ(ParseClamdReply("stream: lstat() failed. ERROR"),
            (ScanResult{Outcome::kError, "clamd: stream: lstat() failed. ERROR"}));
  EXPECT_EQ(ParseClamdReply("PONG"), (ScanResult{Outcome::kError, "clamd: PONG"}));
  EXPECT_EQ(ParseClamdReply(""), (ScanResult{Outcome::kError, "clamd closed the connection without an answer"}));
}

}  // namespace
}  // namespace oml::review
