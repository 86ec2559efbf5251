// A small synchronous HTTP/1.1 client on Boost.Beast, for the `oml` commands that talk to a
// running server (`oml claim submit`, cli/claim_submit.h).
//
// Plain HTTP only: the server listens on loopback or a private network, and production puts a
// TLS-terminating proxy in front of it (docs/operations/deployment.md "Uploading files"). A
// client outside that network reaches the server through such a proxy's plain-HTTP side, or
// an SSH/stunnel tunnel; `https://` server URLs are refused with that advice.
//
// One keep-alive connection, reopened when the server closed it, when it sat idle longer than
// kMaxIdle (the server closes idle connections after its request timeout), or after an error.
// Every operation (connect, send, receive) has the client's timeout. Memory: the request body
// is sent from the caller's buffer (no copy); a response body is read whole, up to
// kMaxResponseBody.
//
// Not thread-safe: one client per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace oml::cli {

// The server's address from a URL "http://host[:port][/]" (IPv6 as "[::1]"); port 80 by
// default. kInvalidArgument otherwise: another scheme (https: the advice above), a path,
// query, user info, or an empty host.
struct ServerUrl {
  std::string host;  // without brackets
  std::string port;  // decimal
  // "http://host:port" (IPv6 host bracketed): the prefix of every request URL, and the part
  // of a state file's name (claim_submit.cc) that names the server.
  std::string base;
};
Result<ServerUrl> ParseServerUrl(std::string_view url);

// The server URL of a listen address "host:port" (config `listen`): a wildcard host (0.0.0.0,
// ::, empty) becomes the loopback address of its family.
std::string ServerUrlOfListen(const std::string& listen);

struct HttpResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // as received
  std::string body;

  // The first field named `name` (case-insensitive).
  std::optional<std::string> Header(std::string_view name) const;
};

class HttpClient {
 public:
  static constexpr auto kMaxIdle = std::chrono::seconds(2);
  static constexpr size_t kMaxResponseBody = 4 << 20;

  HttpClient(ServerUrl server, std::chrono::milliseconds timeout);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends `method target` (target: an absolute path, e.g. "/v1/uploads") with `headers` and
  // `body` (Content-Length is set; no body field for an empty body unless `send_empty_body`),
  // and reads the response (a HEAD response has no body). Host and User-Agent are added.
  // kUnavailable "server-unreachable" when the connection fails (resolve, connect, send,
  // receive, timeout): the request may or may not have reached the server. kInvalidArgument
  // for a malformed response or one larger than kMaxResponseBody.
  Result<HttpResponse> Send(std::string_view method, std::string_view target,
                            const std::vector<std::pair<std::string, std::string>>& headers, std::string_view body,
                            bool send_empty_body = false);

  const ServerUrl& server() const { return server_; }

 private:
  struct Conn;
  Status Connect();
  void Drop();

  ServerUrl server_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Conn> conn_;
  std::chrono::steady_clock::time_point last_used_{};
};

}  // namespace oml::cli
