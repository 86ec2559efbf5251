// The HTTP/1.1 transport of the API, on Boost.Beast.
//
// Why Beast (docs/operations/deployment.md "Limits" has the long form): Debian's cpp-httplib 0.11.4 bounded request
// bodies only when they carried Content-Length, inflated gzip bodies into memory, let header
// lines and counts grow without limit, and gave each connection a thread for its whole
// keep-alive life. Beast leaves every one of those decisions to us, and is maintained as part of
// Boost (Debian's libboost1.81-dev, header-only).
//
// Contract: whatever a client sends, one request costs at most
//   max_header_bytes + 64 KiB (read buffer) + max_body_bytes
// of memory before a handler runs, and every refusal is decided from the header alone, before
// the body is read:
//   431 header section larger than max_header_bytes, or more than max_header_fields fields
//   404 no route for the path; 405 (with Allow) a method the path does not take
//   415 a Content-Encoding other than identity (with Accept-Encoding: identity)
//   501 a Transfer-Encoding other than chunked
//   411 a route that needs a body, sent with neither Content-Length nor Transfer-Encoding
//   413 Content-Length above max_body_bytes, or a chunked body that grows past it, or a body
//       sent to a route that takes none
//   408 the whole request (header and body) did not arrive within request_timeout
//   400 anything Beast cannot parse (including Content-Length with Transfer-Encoding)
//   503 more than max_connections connections open at once (answered, then closed)
// A request with neither Content-Length nor Transfer-Encoding has an empty body (RFC 9112
// §6.3). After a refusal whose body was not read, the connection is closed (lingering close:
// the server stops sending, then discards what the client still sends for a moment, so that
// the client reads the answer instead of a reset).
//
// Connections are served asynchronously on io_threads; a slow client costs a socket and a
// buffer, never a thread. Handlers run on worker_threads, one request at a time per
// connection. A connection serves at most max_requests_per_connection requests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace oml::api::http {

struct Limits {
  uint64_t max_body_bytes = 6 * (1u << 20) + 64 * 1024;
  uint32_t max_header_bytes = 16 * 1024;  // request line and every header line together
  uint32_t max_header_fields = 100;
  std::chrono::milliseconds request_timeout{10000};  // from waiting for a request to having it whole
  std::chrono::milliseconds write_timeout{10000};    // to send one response
  uint32_t max_requests_per_connection = 1000;
  uint32_t max_connections = 1024;
  int io_threads = 1;
  int worker_threads = 32;
};

struct Request {
  std::string method;  // as sent, e.g. "POST"
  std::string path;    // the target up to '?', not percent-decoded
  std::string query;   // after '?', raw
  std::vector<std::string> captures;                         // the route's regex groups
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in order
  std::string body;

  // Number of field lines named `name` (case-insensitive), and the first one's value.
  size_t HeaderCount(std::string_view name) const;
  std::optional<std::string> Header(std::string_view name) const;
  // The first query parameter `name`, percent-decoded ('+' is a space); nullopt if absent.
  std::optional<std::string> Param(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // A body sent piece by piece instead of `body` (issue 19: a file of any size in constant
  // memory per response). `stream_length` bytes in all (the Content-Length). `stream` is called
  // on a worker thread, one piece at a time, the next only after the previous was written to
  // the socket, so a reader that does not read holds one piece and no worker; each write has
  // Limits::write_timeout. It returns the next bytes ("" at the end). An error, or a total that
  // differs from stream_length, after the header was sent closes the connection: the client
  // sees a body shorter than Content-Length, never a wrong one passed off as whole.
  std::function<Result<std::string>()> stream;
  uint64_t stream_length = 0;
  // Optional, with `stream`: each piece, once written, is handed back here (on the connection's
  // executor, before `stream` is called again), so that the producer can fill its memory with
  // the next piece instead of a fresh allocation's.
  std::function<void(std::string)> recycle;

  void SetHeader(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
};

enum class BodyPolicy { kNone, kOptional, kRequired };

struct Route {
  std::string method;  // "GET", "POST", ...
  std::string pattern; // ECMAScript regex matched against the whole path
  std::string name;    // for metrics and logs, e.g. "/v1/claims/{id}"
  BodyPolicy body = BodyPolicy::kNone;
  std::function<void(const Request&, Response&)> handler;
  // A POST carrying `X-HTTP-Method-Override: <method>` (sent once) reaches this route as if it
  // were a <method> request, and the handler sees <method> (tus 1.0 core: clients behind
  // proxies that drop PATCH or DELETE). Other routes ignore the header. The response is framed
  // for the method on the wire: an overridden HEAD's answer keeps its body (a problem's, say),
  // since the client sent a POST and reads one.
  bool method_override = false;
};

// Builds the answer to a refusal made by the transport (status, problem slug, detail, path).
using ProblemFn = std::function<Response(int status, const std::string& slug, const std::string& detail,
                                         const std::string& path)>;
// Called once per answered request: method, route name ("unmatched" without one), status, seconds.
using ObserveFn = std::function<void(const std::string& method, const std::string& route, int status, double seconds)>;

class Server {
 public:
  Server(Limits limits, std::vector<Route> routes, ProblemFn problem, ObserveFn observe);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0 picks one). kUnavailable if it cannot.
  Status Bind(const std::string& host, int port);
  int port() const;
  // Serves until Stop(); the calling thread is one of the I/O threads.
  Status Run();
  // Makes Run() return after the handlers in progress finish. Thread-safe; idempotent.
  void Stop();

  struct Impl;  // opaque; public only so that the connection code in http.cc can name it

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace oml::api::http
