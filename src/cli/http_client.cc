#include "cli/http_client.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>

#include "common/config.h"

namespace oml::cli {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

Status Unreachable(const ServerUrl& s, const std::string& what, const beast::error_code& ec) {
  return Unavailable("cannot reach the server at " + s.base + ": " + what + ": " + ec.message(), "server-unreachable");
}

}  // namespace

Result<ServerUrl> ParseServerUrl(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("server URL '" + std::string(url.substr(0, 200)) + "': " + why, "invalid-server-url");
  };
  constexpr std::string_view kHttp = "http://";
  if (url.size() >= 8 && IEquals(url.substr(0, 8), "https://"))
    return bad("oml speaks plain HTTP to the server's own listener (loopback or a private network); TLS ends at "
               "the proxy in front of it. Give the http:// address the proxy forwards to, or reach it through a "
               "tunnel (ssh -L, stunnel)");
  if (url.size() < kHttp.size() || !IEquals(url.substr(0, kHttp.size()), kHttp)) return bad("must start with http://");
  std::string_view rest = url.substr(kHttp.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos)
    return bad("must be http://host[:port] without a path, query or user info");
  ServerUrl s;
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated IPv6 address");
    s.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("expected ':port' after the IPv6 address");
      port = after.substr(1);
    }
  } else {
    const size_t colon = rest.rfind(':');
    s.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
    if (s.host.find(':') != std::string::npos) return bad("an IPv6 address must be written in brackets, e.g. http://[::1]:8470");
  }
  if (s.host.empty()) return bad("the host is empty");
  for (unsigned char ch : s.host)
    if (ch <= 0x20 || ch >= 0x7f) return bad("the host must be printable ASCII");
  if (port.empty() && rest.find(':') != std::string_view::npos && rest.back() == ':') return bad("the port is empty");
  if (port.empty()) port = "80";
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535)
    return bad("the port must be 1..65535");
  s.port = std::string(port);
  s.base = "http://" + (s.host.find(':') != std::string::npos ? "[" + s.host + "]" : s.host) + ":" + s.port;
  return s;
}

std::string ServerUrlOfListen(const std::string& listen) {
  std::string host = Config::HostOf(listen);
  const int port = Config::PortOf(listen);
  if (!host.empty() && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  if (host.find(':') != std::string::npos) host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(port);
}

std::optional<std::string> HttpResponse::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (IEquals(k, name)) return v;
  return std::nullopt;
}

struct HttpClient::Conn {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;

  // Runs one asynchronous operation started by `start(handler)` to completion; the stream's
  // expiry (tcp_stream) turns a stall into beast::error::timeout.
  template <class Start>
  beast::error_code Run(Start&& start) {
    beast::error_code result = asio::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }
};

HttpClient::HttpClient(ServerUrl server, std::chrono::milliseconds timeout) : server_(std::move(server)), timeout_(timeout) {}
HttpClient::~HttpClient() { Drop(); }

void HttpClient::Drop() {
  if (!conn_) return;
  beast::error_code ignored;
  conn_->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  conn_->stream.close();
  conn_.reset();
}

Status HttpClient::Connect() {
  Drop();
  auto c = std::make_unique<Conn>();
  tcp::resolver resolver(c->ioc);
  beast::error_code ec;
  auto results = resolver.resolve(server_.host, server_.port, ec);
  if (ec) return Unreachable(server_, "resolve " + server_.host, ec);
  c->stream.expires_after(timeout_);
  ec = c->Run([&](auto handler) { c->stream.async_connect(results, std::move(handler)); });
  if (ec) return Unreachable(server_, "connect", ec);
  conn_ = std::move(c);
  return Status::Ok();
}

Result<HttpResponse> HttpClient::Send(std::string_view method, std::string_view target,
                                      const std::vector<std::pair<std::string, std::string>>& headers,
                                      std::string_view body, bool send_empty_body) {
  bhttp::request<bhttp::span_body<const char>> req;
  req.version(11);
  req.method_string(beast::string_view(method.data(), method.size()));
  req.target(beast::string_view(target.data(), target.size()));
  req.set(bhttp::field::host, server_.base.substr(7));
  req.set(bhttp::field::user_agent, "oml-cli");
  for (const auto& [k, v] : headers) req.insert(k, v);
  req.body() = boost::span<const char>(body.data(), body.size());
  const bool with_length = !body.empty() || send_empty_body || method == "POST" || method == "PATCH" || method == "PUT";
  if (with_length) req.content_length(body.size());
  const bool is_head = method == "HEAD";

  // A kept-alive connection the server may have closed meanwhile: a failure before any byte of
  // the answer is retried once on a fresh connection.
  for (int attempt = 0;; ++attempt) {
    bool reused = conn_ != nullptr && std::chrono::steady_clock::now() - last_used_ < kMaxIdle;
    if (!reused) OML_RETURN_IF_ERROR(Connect());
    Conn& c = *conn_;
    c.stream.expires_after(timeout_);
    beast::error_code wec = c.Run([&](auto handler) { bhttp::async_write(c.stream, req, std::move(handler)); });
    // Even after a failed write, the server may have answered (e.g. 413 from the header alone,
    // then closed): read what it sent.
    bhttp::response_parser<bhttp::string_body> parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(kMaxResponseBody);
    if (is_head) parser.skip(true);
    c.stream.expires_after(timeout_);
    beast::error_code rec = c.Run([&](auto handler) { bhttp::async_read(c.stream, c.buffer, parser, std::move(handler)); });
    if (rec) {
      const bool nothing_read = !parser.got_some();
      Drop();
      if (reused && attempt == 0 && nothing_read) continue;
      if (rec == bhttp::error::body_limit)
        return InvalidArgument("the server's answer to " + std::string(method) + " " + std::string(target) +
                                   " is larger than " + std::to_string(kMaxResponseBody) + " bytes",
                               "invalid-response");
      if (wec) return Unreachable(server_, "send " + std::string(method) + " " + std::string(target), wec);
      return Unreachable(server_, "receive the answer to " + std::string(method) + " " + std::string(target), rec);
    }
    auto msg = parser.release();
    HttpResponse out;
    out.status = static_cast<int>(msg.result_int());
    for (const auto& f : msg)
      out.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    out.body = std::move(msg.body());
    if (wec || !msg.keep_alive()) Drop();
    else last_used_ = std::chrono::steady_clock::now();
    return out;
  }
}

}  // namespace oml::cli
