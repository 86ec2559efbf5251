// A clamd client: ClamAV's daemon scans a stream sent with the INSTREAM command.
//
// Protocol (clamd(8), "INSTREAM"), as this client speaks it:
//
//   client -> "zINSTREAM\0"
//   client -> { uint32 big-endian length n > 0, n bytes }*   (chunks of at most kChunkBytes)
//   client -> uint32 0                                       (end of stream)
//   clamd  -> "stream: OK\0"                      clean
//             "stream: <signature> FOUND\0"       infected
//             "<message> ERROR\0"                 e.g. "INSTREAM size limit exceeded. ERROR"
//   clamd closes the connection (one command per connection).
//
// clamd may answer and close before the stream ends (StreamMaxLength exceeded): a failed send
// is therefore not the end; Finish() still reads whatever clamd answered.
//
// Addresses (config `clamd_address`): "unix:/run/clamav/clamd.ctl" or an absolute path for a
// unix socket; "tcp:host:port", "host:port" or "[v6addr]:port" for TCP. "" = not configured.
//
// Every socket operation (connect, each send, the wait for the answer) is bounded by the
// timeout; the answer may take as long as clamd needs to scan the whole stream, so the timeout
// must cover the scan of the largest attachment.
//
// Thread safety: a ClamdStream is used by one thread at a time; distinct streams are
// independent.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace oml::review {

// A parsed clamd_address.
struct ClamdAddress {
  bool unix_socket = false;
  std::string path;        // unix socket
  std::string host, port;  // TCP
};
// kInvalidArgument for an address that is none of the forms above ("" included).
Result<ClamdAddress> ParseClamdAddress(std::string_view address);

// A scan's outcome, with its text form (ToString) as the API reports it:
//   "not-configured" | "clean" | "infected: <signature>" | "error: <message>"
struct ScanResult {
  enum class Outcome { kNotConfigured, kClean, kInfected, kError };
  Outcome outcome = Outcome::kNotConfigured;
  std::string detail;  // the signature (kInfected) or what went wrong (kError)
  std::string ToString() const;
  bool operator==(const ScanResult&) const = default;
};

// An open INSTREAM session. Move-only; the socket is closed when it goes.
class ClamdStream {
 public:
  static constexpr size_t kChunkBytes = 64 * 1024;

  // Connects and sends the command. kInvalidArgument for a malformed address, kUnavailable
  // when clamd cannot be reached within timeout_ms.
  static Result<ClamdStream> Open(const std::string& address, int timeout_ms);

  ClamdStream(ClamdStream&& o) noexcept;
  ClamdStream& operator=(ClamdStream&& o) noexcept;
  ClamdStream(const ClamdStream&) = delete;
  ClamdStream& operator=(const ClamdStream&) = delete;
  ~ClamdStream();

  // Sends bytes (split into chunks of at most kChunkBytes). kUnavailable when the send fails
  // or times out; call Finish() anyway: clamd may have said why (size limit).
  Status Write(std::string_view bytes);
  // Ends the stream (unless a Write failed) and reads clamd's answer. Never kNotConfigured.
  ScanResult Finish();

 private:
  ClamdStream(int fd, int timeout_ms) : fd_(fd), timeout_ms_(timeout_ms) {}
  Status SendAll(const char* p, size_t n);
  int fd_ = -1;
  int timeout_ms_ = 0;
  bool write_failed_ = false;
  std::string write_error_;
};

// Parses one clamd answer (without its terminating NUL): "stream: OK" -> kClean, "stream: X
// FOUND" -> kInfected X, "... ERROR" and anything else -> kError with the text.
ScanResult ParseClamdReply(std::string_view reply);

// Scans `bytes` in one call: Open, Write, Finish. Every failure is a kError result;
// address "" gives kNotConfigured.
ScanResult ClamdScan(const std::string& address, std::string_view bytes, int timeout_ms);

}  // namespace oml::review
