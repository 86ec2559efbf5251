#include "api/http.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cstring>
#include <set>
#include <thread>

#include "common/log.h"

namespace oml::api::http {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower((unsigned char)x) == std::tolower((unsigned char)y); });
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct CompiledRoute {
  Route route;
  std::regex re;
};

}  // namespace

size_t Request::HeaderCount(std::string_view name) const {
  return std::count_if(headers.begin(), headers.end(), [&](const auto& h) { return IEquals(h.first, name); });
}

std::optional<std::string> Request::Header(std::string_view name) const {
  for (const auto& h : headers)
    if (IEquals(h.first, name)) return h.second;
  return std::nullopt;
}

std::optional<std::string> Request::Param(std::string_view name) const {
  std::string_view q = query;
  while (!q.empty()) {
    size_t amp = q.find('&');
    std::string_view part = q.substr(0, amp);
    size_t eq = part.find('=');
    if (PercentDecode(part.substr(0, eq)) == name)
      return eq == std::string_view::npos ? std::string() : PercentDecode(part.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

struct Server::Impl {
  // Declaration order is destruction order reversed: sessions (owned by handlers queued on the
  // workers and on the io_context) reach back into the fields above them.
  const Limits limits;
  std::vector<CompiledRoute> routes;
  ProblemFn problem;
  ObserveFn observe;
  std::atomic<uint32_t> connections{0};
  std::atomic<bool> stopping{false};
  std::atomic<int> in_flight{0};  // requests dispatched to a handler whose answer is not yet sent
  // Bytes of request-body capacity that connections keep for their next request (Session::
  // spare_body_), at most kSpareBodyBudget in all.
  std::atomic<size_t> spare_body_bytes{0};

  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  asio::steady_timer accept_backoff{ioc};
  asio::steady_timer drain_timer{ioc};
  Clock::time_point drain_deadline;
  asio::thread_pool workers;

  Impl(Limits l, std::vector<Route> rs, ProblemFn p, ObserveFn o)
      : limits(l), problem(std::move(p)), observe(std::move(o)), ioc(std::max(1, l.io_threads)),
        workers(std::max(1, l.worker_threads)) {
    for (auto& r : rs) {
      std::regex re(r.pattern, std::regex::ECMAScript);
      routes.push_back({std::move(r), std::move(re)});
    }
  }

  void Accept();
  // Stop(): no new connection, no new request; the requests already dispatched get their
  // answers (with Connection: close) for up to kDrainTime, then the I/O stops.
  void Drain();
  static constexpr auto kDrainTime = std::chrono::seconds(5);
};

namespace {

// One connection. Lives as long as an operation or a queued handler holds it.
constexpr size_t kMaxTargetBytes = 2048;  // 414 above

// Request bodies are reused (issue 22, "buffers are reused across requests"): a connection keeps
// the capacity of its last request's body for its next one, so the pages of a multi-MiB chunk
// are not faulted in again for every PATCH (the server's allocator returns freed pages at once).
// All connections together keep at most this many bytes: an idle keep-alive connection cannot
// pin a chunk's memory beyond it; over it, a body is freed as before.
constexpr size_t kSpareBodyBudget = size_t{64} << 20;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server::Impl* srv, tcp::socket socket)
      : srv_(srv), socket_(std::move(socket)), timer_(socket_.get_executor()), buffer_(kReadBufferBytes(srv->limits)) {}
  ~Session() {
    DropSpare();
    srv_->connections.fetch_sub(1);
  }

  void Start() { ReadHeader(); }

 private:
  static size_t kReadBufferBytes(const Limits& l) { return l.max_header_bytes + 64 * 1024; }

  // The whole-request deadline: when it passes, the pending read is cancelled and the request
  // answered 408 (or the connection closed, if no byte of a request had arrived).
  void ArmDeadline(std::chrono::milliseconds d) {
    timed_out_ = false;
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      // Cancelled, or re-armed after this wait had already completed.
      if (ec || self->timer_.expiry() > Clock::now()) return;
      // cancel() only reaches a read still waiting in the reactor; shutting the receive side
      // also ends any read started after this point. Every continuation checks timed_out_.
      self->timed_out_ = true;
      beast::error_code ignored;
      self->socket_.cancel(ignored);
      self->socket_.shutdown(tcp::socket::shutdown_receive, ignored);
    });
  }

  // Keeps `body`'s capacity for the next request if the budget allows (else frees it).
  void KeepSpare(std::string body) {
    DropSpare();
    const size_t cap = body.capacity();
    if (cap < (size_t{64} << 10)) return;  // small bodies: nothing worth keeping
    size_t held = srv_->spare_body_bytes.load();
    do {
      if (held + cap > kSpareBodyBudget) return;
    } while (!srv_->spare_body_bytes.compare_exchange_weak(held, held + cap));
    body.clear();
    spare_body_ = std::move(body);
    spare_bytes_ = cap;
  }
  void DropSpare() {
    if (spare_bytes_ == 0) return;
    srv_->spare_body_bytes.fetch_sub(spare_bytes_);
    spare_bytes_ = 0;
    std::string().swap(spare_body_);
  }

  void ReadHeader() {
    parser_.emplace();
    if (spare_bytes_ > 0) {
      // Still counted against the budget until the request is dispatched (Dispatch: KeepSpare).
      parser_->get().body() = std::move(spare_body_);
      spare_body_.clear();
    }
    parser_->header_limit(srv_->limits.max_header_bytes);
    parser_->body_limit(srv_->limits.max_body_bytes);
    route_ = nullptr;
    captures_.clear();
    headers_.clear();
    method_.clear();
    wire_method_.clear();
    path_.clear();
    query_.clear();
    version_ = 11;
    started_ = Clock::now();
    if (srv_->stopping.load()) return Close();
    ArmDeadline(srv_->limits.request_timeout);
    bhttp::async_read_header(socket_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnHeader(ec, n); });
  }

  void RequestTimeout() {
    Refuse(408, "request-timeout",
           "the request did not arrive within " + std::to_string(srv_->limits.request_timeout.count()) + " ms");
  }

  void OnHeader(beast::error_code ec, size_t bytes) {
    if (timed_out_) {
      if (!ec) return RequestTimeout();
      if (bytes == 0 && buffer_.size() == 0) return Close();  // an idle keep-alive connection
      return RequestTimeout();
    }
    if (ec) {
      if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == asio::error::operation_aborted)
        return Close();
      if (ec == bhttp::error::header_limit)
        return Refuse(431, "headers-too-large",
                      "the request line and header fields exceed " + std::to_string(srv_->limits.max_header_bytes) + " bytes");
      if (ec == bhttp::error::buffer_overflow)
        return Refuse(431, "headers-too-large", "a header line is too long");
      if (ec == bhttp::error::body_limit) {  // a Content-Length above the limit, seen in the header
        // The header is parsed: name the path, so that the answer carries what the server adds
        // for it (tus: Tus-Resumable on every /v1/uploads response).
        const std::string_view target = parser_->get().target();
        path_ = std::string(target.substr(0, target.find('?')));
        return Refuse(413, "body-too-large",
                      "request body exceeds the limit of " + std::to_string(srv_->limits.max_body_bytes) + " bytes");
      }
      return Refuse(400, "malformed-request", std::string("malformed HTTP request: ") + ec.message());
    }
    auto& req = parser_->get();
    started_ = Clock::now();
    method_ = std::string(req.method_string());
    wire_method_ = method_;
    version_ = req.version();
    const std::string_view target(req.target().data(), req.target().size());
    // Routing uses std::regex, whose matcher recurses per character: a long target is refused
    // before it reaches it.
    if (target.size() > kMaxTargetBytes)
      return Refuse(414, "uri-too-long", "the request target exceeds " + std::to_string(kMaxTargetBytes) + " bytes");
    const size_t q = target.find('?');
    path_ = std::string(target.substr(0, q));
    query_ = q == std::string_view::npos ? std::string() : std::string(target.substr(q + 1));

    // The handler sees the header section as it was now: trailer fields that a chunked body
    // may carry are never merged into it (RFC 9110 section 6.5.1), see Dispatch.
    for (const auto& f : req) {
      if (headers_.size() >= srv_->limits.max_header_fields)
        return Refuse(431, "headers-too-large",
                      "more than " + std::to_string(srv_->limits.max_header_fields) + " header fields");
      std::string name(f.name_string().data(), f.name_string().size());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      headers_.emplace_back(std::move(name), std::string(f.value().data(), f.value().size()));
    }

    // Route: the path first (404), then the method (405 with Allow).
    // HEAD of a path with no HEAD route of its own is its GET route (RFC 9110 §9.3.2): the handler
    // sees method "HEAD" (and must cause no side effect), the transport sends the header only.
    // X-HTTP-Method-Override on a POST: the overriding method is tried first, on routes that
    // honour it (Route::method_override); found, it is the request's method from here on.
    std::string override_method;
    if (method_ == "POST") {
      int n = 0;
      for (const auto& [name, value] : headers_)
        if (name == "x-http-method-override" && ++n == 1) override_method = Trim(value);
      if (n != 1) override_method.clear();
      std::transform(override_method.begin(), override_method.end(), override_method.begin(),
                     [](unsigned char c) { return std::toupper(c); });
    }
    if (!override_method.empty()) {
      for (const auto& r : srv_->routes) {
        if (!r.route.method_override || r.route.method != override_method) continue;
        std::smatch m;
        if (!std::regex_match(path_, m, r.re)) continue;
        route_ = &r.route;
        method_ = override_method;
        for (size_t i = 1; i < m.size(); ++i) captures_.push_back(m[i].str());
        break;
      }
    }
    std::set<std::string> allowed;
    const Route* get_route = nullptr;
    std::vector<std::string> get_captures;
    for (const auto& r : srv_->routes) {
      if (route_ != nullptr) break;  // chosen by X-HTTP-Method-Override
      std::smatch m;
      if (!std::regex_match(path_, m, r.re)) continue;
      allowed.insert(r.route.method);
      if (r.route.method == "GET") {
        allowed.insert("HEAD");
        if (get_route == nullptr) {
          get_route = &r.route;
          for (size_t i = 1; i < m.size(); ++i) get_captures.push_back(m[i].str());
        }
      }
      if (r.route.method != method_) continue;
      route_ = &r.route;
      for (size_t i = 1; i < m.size(); ++i) captures_.push_back(m[i].str());
      break;
    }
    if (route_ == nullptr && method_ == "HEAD" && get_route != nullptr) {
      route_ = get_route;
      captures_ = std::move(get_captures);
    }
    if (route_ == nullptr) {
      if (allowed.empty()) return Refuse(404, "no-route", "no such route " + method_ + " " + path_);
      std::string allow;
      for (const auto& a : allowed) allow += (allow.empty() ? "" : ", ") + a;
      return Refuse(405, "method-not-allowed", method_ + " is not allowed on " + path_ + "; allowed: " + allow,
                    {{"Allow", allow}});
    }

    // Codings: no content coding is accepted (a compressed body could inflate without bound),
    // and no transfer coding but chunked.
    if (auto ce = req.find(bhttp::field::content_encoding); ce != req.end()) {
      const std::string v = Trim(std::string_view(ce->value().data(), ce->value().size()));
      if (!IEquals(v, "identity"))
        return Refuse(415, "unsupported-content-encoding",
                      "Content-Encoding '" + v.substr(0, 64) + "' is not accepted; send the body uncompressed",
                      {{"Accept-Encoding", "identity"}});
    }
    // Transfer codings: chunked, once and last (RFC 9112 section 6.1); any other coding is 501.
    if (req.count(bhttp::field::transfer_encoding) > 1)
      return Refuse(400, "malformed-request", "Transfer-Encoding sent more than once");
    if (auto te = req.find(bhttp::field::transfer_encoding); te != req.end()) {
      const std::string_view all(te->value().data(), te->value().size());
      int chunked = 0, tokens = 0;
      std::string other;
      for (size_t b = 0; b <= all.size();) {
        size_t e = all.find(',', b);
        if (e == std::string_view::npos) e = all.size();
        const std::string tok = Trim(all.substr(b, e - b));
        ++tokens;
        if (IEquals(tok, "chunked")) ++chunked;
        else if (other.empty()) other = tok.empty() ? "(empty)" : tok;
        b = e + 1;
      }
      if (!other.empty())
        return Refuse(501, "unsupported-transfer-encoding",
                      "Transfer-Encoding '" + other.substr(0, 64) + "' is not supported; use chunked or Content-Length");
      if (chunked != 1 || tokens != 1) return Refuse(400, "malformed-request", "chunked must be applied exactly once");
    }

    const bool chunked = parser_->chunked();
    const boost::optional<uint64_t> length = parser_->content_length();
    const bool has_body = chunked || (length && *length > 0);
    if (route_->body == BodyPolicy::kNone && has_body)
      return Refuse(413, "body-too-large", method_ + " " + route_->name + " takes no request body");
    if (route_->body == BodyPolicy::kRequired && !chunked && !length)
      return Refuse(411, "length-required", "this request needs a body with Content-Length or Transfer-Encoding: chunked");
    if (length && *length > srv_->limits.max_body_bytes)
      return Refuse(413, "body-too-large",
                    "request body of " + std::to_string(*length) + " bytes exceeds the limit of " +
                        std::to_string(srv_->limits.max_body_bytes) + " bytes");

    if (parser_->is_done()) return Dispatch();
    // A chunked body grows its string by doubling, which could hold up to twice the limit plus
    // the old copy: reserve the limit once instead. Large reservations are mapped, not
    // touched, so the resident cost is what actually arrives.
    if (chunked) req.body().reserve(srv_->limits.max_body_bytes);
    if (auto ex = req.find(bhttp::field::expect); ex != req.end() && req.version() >= 11) {
      if (!IEquals(Trim(std::string_view(ex->value().data(), ex->value().size())), "100-continue"))
        return Refuse(417, "expectation-failed", "only Expect: 100-continue is supported");
      auto cont = std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, req.version());
      bhttp::async_write(socket_, *cont, [self = shared_from_this(), cont](beast::error_code ec, size_t) {
        if (self->timed_out_) return self->RequestTimeout();
        if (ec) return self->Close();
        self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    if (timed_out_) return RequestTimeout();
    if (const auto length = parser_->content_length(); length && !parser_->chunked()) return ReadSizedBody(*length);
    bhttp::async_read(socket_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnBody(ec, n); });
  }

  // A body of Content-Length `length` (checked against max_body_bytes from the header) is read
  // straight into the message's body: the bytes already in the read buffer, then reads of
  // whatever the socket holds, up to what is still missing. Beast's parser would read it 64 KiB
  // at a time through the read buffer and copy it again; a multi-MiB chunk then cost thousands
  // of reads. Nothing past the body is read: a pipelined next request stays in the socket. The
  // body's string grows with what arrived (to at most twice that, at least 64 KiB ahead), never
  // to the declared length up front: a client that declares 6 MiB and sends nothing holds no
  // more memory than Beast's reader would give it.
  void ReadSizedBody(uint64_t length) {
    sized_length_ = length;
    std::string& body = parser_->get().body();
    const size_t have = std::min<size_t>(buffer_.size(), length);
    body.resize(have);
    if (have > 0) std::memcpy(body.data(), buffer_.data().data(), have);
    buffer_.consume(have);
    ReadSizedMore(have);
  }
  void ReadSizedMore(size_t got) {
    std::string& body = parser_->get().body();
    if (got == sized_length_) return OnSizedBody();
    if (got == body.size())
      body.resize(std::min<size_t>(sized_length_, std::max<size_t>(got + (size_t{64} << 10), 2 * got)));
    socket_.async_read_some(asio::buffer(body.data() + got, body.size() - got),
                            [self = shared_from_this(), got](beast::error_code ec, size_t n) {
                              if (self->timed_out_) return self->RequestTimeout();
                              if (ec) return self->Close();  // eof, reset, or cancelled: the client left
                              self->ReadSizedMore(got + n);
                            });
  }
  void OnSizedBody() {
    if (timed_out_) return RequestTimeout();
    Dispatch();
  }

  void OnBody(beast::error_code ec, size_t) {
    if (timed_out_) return RequestTimeout();
    if (ec) {
      if (ec == asio::error::operation_aborted) return Close();
      if (ec == bhttp::error::body_limit)
        return Refuse(413, "body-too-large",
                      "request body exceeds the limit of " + std::to_string(srv_->limits.max_body_bytes) + " bytes");
      if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == bhttp::error::partial_message)
        return Close();
      if (ec == bhttp::error::buffer_overflow) return Refuse(400, "malformed-request", "a chunk header line is too long");
      return Refuse(400, "malformed-request", std::string("malformed HTTP request body: ") + ec.message());
    }
    Dispatch();
  }

  // Runs the handler on a worker; the answer is written back on this connection's executor.
  void Dispatch() {
    timer_.cancel();
    auto msg = parser_->release();
    size_t fields = 0;
    for (auto it = msg.begin(); it != msg.end(); ++it) ++fields;
    if (fields != headers_.size()) return Refuse(400, "malformed-request", "trailer fields are not accepted");
    ++served_;
    keep_alive_ = msg.keep_alive() && served_ < srv_->limits.max_requests_per_connection && !srv_->stopping.load();
    auto req = std::make_shared<Request>();
    req->method = method_;
    req->path = path_;
    req->query = query_;
    req->captures = std::move(captures_);
    req->headers = std::move(headers_);
    req->body = std::move(msg.body());
    srv_->in_flight.fetch_add(1);
    const Route* route = route_;
    asio::post(srv_->workers, [self = shared_from_this(), req, route] {
      auto res = std::make_shared<Response>();
      try {
        route->handler(*req, *res);
      } catch (const std::exception& e) {
        log::Error("handler threw", {{"path", req->path}, {"error", e.what()}});
        *res = self->srv_->problem(500, "internal", "internal error; the server log has the details", req->path);
      }
      asio::post(self->socket_.get_executor(), [self, res, req] {
        // The handler is done with the body: its capacity serves the next request.
        self->KeepSpare(std::move(req->body));
        self->Write(std::move(*res), !self->keep_alive_ || self->srv_->stopping.load(), /*dispatched=*/true);
      });
    });
  }

  // Answers a request the transport refuses. The body (if any) was not read: close after.
  void Refuse(int status, const std::string& slug, const std::string& detail,
              std::vector<std::pair<std::string, std::string>> extra = {}) {
    timer_.cancel();
    Response r = srv_->problem(status, slug, detail, path_.empty() ? "/" : path_);
    for (auto& h : extra) r.headers.push_back(std::move(h));
    Write(std::move(r), /*close=*/true, /*dispatched=*/false);
  }

  // Sends a streamed answer (Response::stream): the header, then each piece as the worker pool
  // produces it, one at a time.
  void WriteStream(Response r, bool close, bool dispatched) {
    auto res = std::make_shared<bhttp::response<bhttp::empty_body>>(static_cast<bhttp::status>(r.status),
                                                                      version_ == 10 ? 10 : 11);
    if (!r.content_type.empty()) res->set(bhttp::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res->set(k, v);
    res->content_length(r.stream_length);
    res->keep_alive(!close);
    srv_->observe(method_, route_ ? route_->name : "unmatched", r.status,
                  std::chrono::duration<double>(Clock::now() - started_).count());
    auto sr = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*res);
    ArmWriteTimer();
    auto stream = std::make_shared<Producer>(Producer{std::move(r.stream), std::move(r.recycle)});
    const uint64_t length = r.stream_length;
    const bool head = wire_method_ == "HEAD";
    bhttp::async_write_header(socket_, *sr, [self = shared_from_this(), res, sr, stream, length, close, dispatched,
                                             head](beast::error_code ec, size_t) {
      self->timer_.cancel();
      if (ec) return self->EndStream(dispatched, /*ok=*/false, close);
      if (head || length == 0) return self->EndStream(dispatched, /*ok=*/true, close);
      self->NextPiece(stream, length, 0, close, dispatched);
    });
  }

  // A streamed answer's pieces (Response::stream) and where written ones go back (recycle).
  struct Producer {
    std::function<Result<std::string>()> next;
    std::function<void(std::string)> recycle;
    Result<std::string> operator()() const { return next(); }
  };

  // Produces the next piece on a worker, then writes it on this connection's executor.
  void NextPiece(std::shared_ptr<Producer> stream, uint64_t length, uint64_t sent, bool close, bool dispatched) {
    asio::post(srv_->workers, [self = shared_from_this(), stream, length, sent, close, dispatched] {
      // An exception must not escape into the pool (asio would terminate the process).
      Result<std::string> piece = Status(Code::kInternal, "the response stream threw");
      try {
        piece = (*stream)();
      } catch (const std::exception& e) {
        piece = Status(Code::kInternal, std::string("the response stream threw: ") + e.what());
      }
      asio::post(self->socket_.get_executor(), [self, stream, length, sent, close, dispatched,
                                                piece = std::make_shared<Result<std::string>>(std::move(piece))] {
        if (!piece->ok() || (*piece)->empty() || sent + (*piece)->size() > length) {
          // Whole only if every byte was sent and the stream says it has ended.
          const bool whole = piece->ok() && (*piece)->empty() && sent == length;
          if (!piece->ok())
            log::Warn("a streamed response ended early", {{"path", self->path_}, {"error", piece->status().ToString()}});
          else if (stream->recycle)
            stream->recycle(std::move(**piece));  // an overrunning piece: back like a written one
          return self->EndStream(dispatched, whole, close);
        }
        self->ArmWriteTimer();
        auto bytes = std::make_shared<std::string>(std::move(**piece));
        asio::async_write(self->socket_, asio::buffer(*bytes),
                          [self, stream, length, sent, close, dispatched, bytes](beast::error_code ec, size_t n) {
                            self->timer_.cancel();
                            if (stream->recycle) stream->recycle(std::move(*bytes));  // written or not
                            if (ec) return self->EndStream(dispatched, /*ok=*/false, close);
                            self->NextPiece(stream, length, sent + n, close, dispatched);
                          });
      });
    });
  }

  // After a streamed answer: as after Write, or a close when it did not end whole.
  void EndStream(bool dispatched, bool ok, bool close) {
    if (dispatched) srv_->in_flight.fetch_sub(1);
    if (!ok) return Close();
    if (close) return LingeringClose();
    ReadHeader();
  }

  // A client that does not read its answer within write_timeout is cut.
  void ArmWriteTimer() {
    timer_.expires_after(srv_->limits.write_timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->timer_.expiry() > Clock::now()) return;
      beast::error_code ignored;
      self->socket_.close(ignored);
    });
  }

  // Sends one answer. `dispatched`: it answers a request handed to a handler (in_flight).
  // After an answer that closes the connection, the close lingers (LingeringClose).
  void Write(Response r, bool close, bool dispatched) {
    if (r.stream) return WriteStream(std::move(r), close, dispatched);
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(static_cast<bhttp::status>(r.status),
                                                                      version_ == 10 ? 10 : 11);
    if (!r.content_type.empty()) res->set(bhttp::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(!close);
    res->prepare_payload();
    // Headers only for a HEAD on the wire; Content-Length stays. A POST that
    // X-HTTP-Method-Override made a HEAD gets its body: the client reads one.
    if (wire_method_ == "HEAD") res->body().clear();
    srv_->observe(method_, route_ ? route_->name : "unmatched", r.status,
                  std::chrono::duration<double>(Clock::now() - started_).count());
    timer_.expires_after(srv_->limits.write_timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->timer_.expiry() > Clock::now()) return;
      beast::error_code ignored;
      self->socket_.close(ignored);  // a client that does not read its answer
    });
    bhttp::async_write(socket_, *res, [self = shared_from_this(), res, close, dispatched](beast::error_code ec, size_t) {
      if (dispatched) self->srv_->in_flight.fetch_sub(1);
      self->timer_.cancel();
      if (ec) return self->Close();
      if (close) return self->LingeringClose();
      self->ReadHeader();
    });
  }

  // Stops sending, then reads and discards for up to 2 s (or 1 MiB) so that the client reads
  // the answer before the connection is reset by its unread bytes.
  void LingeringClose() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    timer_.expires_after(std::chrono::seconds(2));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->timer_.expiry() > Clock::now()) return;
      beast::error_code ignored2;
      self->socket_.close(ignored2);
    });
    Discard();
  }

  void Discard() {
    socket_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->discarded_ += n;
      if (ec || self->discarded_ > (1u << 20)) return self->Close();
      self->Discard();
    });
  }

  void Close() {
    timer_.cancel();
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  Server::Impl* srv_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string spare_body_;  // the last body's capacity, for the next request (KeepSpare)
  uint64_t sized_length_ = 0;  // ReadSizedBody: the Content-Length being read
  size_t spare_bytes_ = 0;  // what this connection counts against kSpareBodyBudget
  const Route* route_ = nullptr;
  std::vector<std::string> captures_;
  std::vector<std::pair<std::string, std::string>> headers_;  // the header section, lower-cased names
  // method_: what routing and the handler see (X-HTTP-Method-Override may change it);
  // wire_method_: what the client sent, which frames the response (a HEAD has no body).
  std::string method_, wire_method_, path_, query_;
  unsigned version_ = 11;
  Clock::time_point started_;
  bool timed_out_ = false;
  bool keep_alive_ = true;
  uint32_t served_ = 0;
  size_t discarded_ = 0;
  std::array<char, 16 * 1024> scratch_;
};

}  // namespace

void Server::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopping.load()) return;
    if (ec) {
      // EMFILE and friends: back off instead of spinning on the failing accept.
      if (ec == asio::error::operation_aborted) return;
      log::Warn("accept failed", {{"error", ec.message()}});
      accept_backoff.expires_after(std::chrono::milliseconds(100));
      accept_backoff.async_wait([this](beast::error_code) { Accept(); });
      return;
    }
    if (connections.fetch_add(1) >= limits.max_connections) {
      connections.fetch_sub(1);
      // Best effort and never blocking: the answer fits one segment.
      Response r = problem(503, "too-many-connections",
                           "the server has " + std::to_string(limits.max_connections) + " connections open; retry later", "/");
      std::string wire = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + r.content_type +
                         "\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " + std::to_string(r.body.size()) +
                         "\r\n\r\n" + r.body;
      beast::error_code ignored;
      socket.non_blocking(true, ignored);
      socket.write_some(asio::buffer(wire), ignored);
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
      observe("", "unmatched", 503, 0.0);
    } else {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(this, std::move(socket))->Start();
    }
    Accept();
  });
}

Server::Server(Limits limits, std::vector<Route> routes, ProblemFn problem, ObserveFn observe)
    : impl_(std::make_unique<Impl>(limits, std::move(routes), std::move(problem), std::move(observe))) {}

Server::~Server() {
  Stop();
  impl_->workers.join();
}

Status Server::Bind(const std::string& host, int port) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": not an IP address");
  tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  return Status::Ok();
}

int Server::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

Status Server::Run() {
  if (!impl_->acceptor.is_open()) return Internal("Run() before Bind()");
  impl_->Accept();
  std::vector<std::thread> extra;
  for (int i = 1; i < impl_->limits.io_threads; ++i) extra.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : extra) t.join();
  impl_->workers.join();
  return Status::Ok();
}

void Server::Impl::Drain() {
  if (in_flight.load() == 0 || Clock::now() >= drain_deadline) {
    ioc.stop();
    return;
  }
  drain_timer.expires_after(std::chrono::milliseconds(20));
  drain_timer.async_wait([this](beast::error_code) { Drain(); });
}

void Server::Stop() {
  if (impl_->stopping.exchange(true)) return;
  asio::post(impl_->ioc, [this] {
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->drain_deadline = Clock::now() + Impl::kDrainTime;
    impl_->Drain();
  });
}

}  // namespace oml::api::http
