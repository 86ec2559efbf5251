#include "api/server.h"

#include <httplib.h>

#include <chrono>
#include <map>
#include <set>

#include "common/log.h"
#include "common/metrics.h"
#include "crypto/crypto.h"
#include "journal/provider.h"

namespace oml::api {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* DefaultSlug(Code c) {
  switch (c) {
    case Code::kInvalidArgument: return "invalid-request";
    case Code::kUnauthenticated: return "unauthenticated";
    case Code::kPermissionDenied: return "forbidden-role";
    case Code::kNotFound: return "not-found";
    case Code::kGone: return "gone";
    case Code::kPayloadTooLarge: return "body-too-large";
    case Code::kFailedPrecondition: return "conflict";
    case Code::kAborted: return "aborted";
    case Code::kUnavailable: return "unavailable";
    case Code::kDataLoss: return "integrity";
    default: return "internal";
  }
}

}  // namespace

int HttpStatus(const Status& s) {
  // Refined by type: well-formed, but its Idempotency-Key belongs to another request.
  if (s.type() == "idempotency-key-reused") return 422;
  switch (s.code()) {
    case Code::kOk: return 200;
    case Code::kInvalidArgument: return 400;
    case Code::kUnauthenticated: return 401;
    case Code::kPermissionDenied: return 403;
    case Code::kNotFound: return 404;
    case Code::kGone: return 410;
    case Code::kPayloadTooLarge: return 413;
    case Code::kFailedPrecondition: return 409;
    case Code::kAborted: return 503;  // transient (serialization failure): retry
    case Code::kUnavailable: return 503;
    case Code::kDataLoss: return 500;
    case Code::kInternal: return 500;
  }
  return 500;
}

std::string ProblemSlug(const Status& s) { return s.type().empty() ? DefaultSlug(s.code()) : s.type(); }

std::string ProblemJson(const Status& s, const std::string& instance) {
  json j = {{"type", "urn:oml:problem:" + ProblemSlug(s)},
            {"title", ProblemSlug(s)},
            {"status", HttpStatus(s)},
            {"detail", s.message()},
            {"instance", instance}};
  return j.dump();
}

struct Server::Impl {
  ServerDeps d;
  httplib::Server http;

  // API-key cache: token hash -> (caller, expiry). Revocation takes effect within kAuthTtl for
  // reads; a write checks the key in its own transaction, and its 401 evicts the entry
  // (ForgetIfRevoked).
  static constexpr auto kAuthTtl = std::chrono::seconds(10);
  std::mutex auth_mu;
  std::map<std::string, std::pair<admission::Caller, Clock::time_point>> auth_cache;

  explicit Impl(ServerDeps deps) : d(deps) {}

  void Problem(httplib::Response& res, const httplib::Request& req, const Status& s) {
    res.status = HttpStatus(s);
    // Internal and database errors are logged in full; clients get no SQL, hosts or role names.
    Status shown = s;
    if (s.code() == Code::kInternal && s.type() != "injected-fault") {
      shown = Status(s.code(), "internal error; the server log has the details", s.type());
    } else if (s.type() == "database-unavailable") {
      shown = Status(s.code(), "the database is unavailable; retry later", s.type());
    }
    res.set_content(ProblemJson(shown, req.path), "application/problem+json");
    if (s.code() == Code::kInternal || s.code() == Code::kDataLoss || s.code() == Code::kUnavailable)
      log::Error("request failed", {{"path", req.path}, {"error", s.ToString()}});
  }

  void Json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(), "application/json");
  }

  // After a write: a 401 from admission means the write's transaction found the key revoked.
  void ForgetIfRevoked(const admission::Caller& c, const Status& s) {
    if (s.code() != Code::kUnauthenticated) return;
    std::lock_guard<std::mutex> l(auth_mu);
    auth_cache.erase(c.api_key_hash);
  }

  Result<admission::Caller> Authenticate(const httplib::Request& req) {
    std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (h.size() <= prefix.size() || h.compare(0, prefix.size(), prefix) != 0)
      return Unauthenticated("missing bearer token", "unauthenticated");
    std::string token = h.substr(prefix.size());
    std::string hash = crypto::Sha256(token);
    {
      std::lock_guard<std::mutex> l(auth_mu);
      auto it = auth_cache.find(hash);
      if (it != auth_cache.end() && it->second.second > Clock::now()) return it->second.first;
    }
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, d.pool->Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Query("SELECT tenant_id, principal, role FROM oml.authenticate($1)", {db::Bytes(hash)}));
    if (r.size() == 0 || r.IsNull(0, 0)) return Unauthenticated("unknown or revoked API key", "unauthenticated");
    admission::Caller caller{r.Get(0, 0), r.Get(0, 1), r.Get(0, 2), journal::ApiKeyId(hash), hash};
    std::lock_guard<std::mutex> l(auth_mu);
    if (auth_cache.size() > 10000) auth_cache.clear();
    auth_cache[hash] = {caller, Clock::now() + kAuthTtl};
    return caller;
  }

  Status WriteGate(const admission::Caller& c) {
    auto why = d.fork->Closed(c.tenant_id);
    if (!why) return Status::Ok();
    return Unavailable("writes to this tenant are refused: " + *why + " (run `oml doctor`)", "chain-fork");
  }

  // Separate from WriteGate (the chain state): the database must run synchronous quorum
  // replication unless the server runs with reduced durability (503 durability-reduced).
  Status DurabilityGate() { return d.durability ? d.durability->Gate() : Status::Ok(); }

  static json MetaJson(const admission::ClaimMeta& m) {
    return {{"artifact_id", m.artifact_id},
            {"version", m.version},
            {"state", m.state},
            {"workarea_id", m.workarea_id},
            {"path", m.path},
            {"principal", m.principal},
            {"writer_key_id", m.writer_key_id},
            {"provenance", m.provenance},
            {"simulation_id", m.simulation_id ? json(*m.simulation_id) : json(nullptr)},
            {"media_type", m.media_type},
            {"size", m.size},
            {"plaintext_sha256", crypto::Hex(m.plaintext_sha256)},
            {"ciphertext_sha256", crypto::Hex(m.ciphertext_sha256)},
            {"submitted_seq", m.submitted_seq},
            {"erased_seq", m.erased_seq ? json(*m.erased_seq) : json(nullptr)}};
  }

  // Parses a JSON object body allowing only `allowed` members.
  Result<json> ParseObject(const httplib::Request& req, const std::set<std::string>& allowed) {
    json j = json::parse(req.body, nullptr, false);
    if (j.is_discarded()) return InvalidArgument("request body is not valid JSON", "malformed-json");
    if (!j.is_object()) return InvalidArgument("request body must be a JSON object", "malformed-json");
    for (auto& [k, v] : j.items())
      if (!allowed.count(k)) return InvalidArgument("unknown field '" + k + "'", "unknown-field");
    return j;
  }

  // A string member. Metadata fields (all but the body) may not hold control characters: they
  // are stored as text columns, where a NUL would silently truncate them. The body is only ever
  // stored encrypted (bytea), so any UTF-8 text is fine.
  static Result<std::string> StringField(const json& j, const char* name, bool required, bool allow_controls = false) {
    if (!j.contains(name) || j[name].is_null()) {
      if (required) return InvalidArgument(std::string("missing field '") + name + "'", "missing-field");
      return std::string();
    }
    if (!j[name].is_string()) return InvalidArgument(std::string("field '") + name + "' must be a string", "invalid-field");
    std::string v = j[name].get<std::string>();
    if (!allow_controls) {
      for (unsigned char ch : v)
        if (ch < 0x20 || ch == 0x7f)
          return InvalidArgument(std::string("field '") + name + "' may not contain control characters", "invalid-field");
    }
    return v;
  }

  // A write's optional Idempotency-Key (IETF httpapi draft "The Idempotency-Key HTTP Header
  // Field"): one field line holding an RFC 8941 sf-string, i.e. a quoted string of printable
  // ASCII in which only \" and \\ are escaped, of 1..255 characters once unescaped. No
  // parameters. Anything else is 400 invalid-idempotency-key. The request fingerprint is
  // SHA-256(method "\n" path "\n" exact body bytes). nullopt without the header.
  Result<std::optional<admission::IdempotencyKey>> IdempotencyKeyOf(const httplib::Request& req) {
    static const char* kField = "Idempotency-Key";
    if (!req.has_header(kField)) return std::optional<admission::IdempotencyKey>();
    auto bad = [](const std::string& why) { return InvalidArgument("Idempotency-Key " + why, "invalid-idempotency-key"); };
    if (req.get_header_value_count(kField) != 1) return bad("must be sent once");
    const std::string v = req.get_header_value(kField);
    const size_t b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
    if (b == std::string::npos || v[b] != '"' || e == b)
      return bad("must be a quoted string (RFC 8941 sf-string), e.g. \"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
    std::string key;
    size_t i = b + 1;
    for (; i < e && v[i] != '"'; ++i) {
      const unsigned char ch = v[i];
      if (ch < 0x20 || ch > 0x7e) return bad("may hold printable ASCII only");
      if (ch == '\\') {
        if (i + 1 >= e || (v[i + 1] != '"' && v[i + 1] != '\\')) return bad("may escape only \" and \\");
        ++i;
      }
      key.push_back(v[i]);
    }
    if (i != e || v[e] != '"') return bad("must be one quoted string without parameters");
    if (Status k = admission::Claims::CheckIdempotencyKey(key); !k.ok()) return k;
    admission::IdempotencyKey idem;
    idem.key = std::move(key);
    idem.request_sha256 = crypto::Sha256(req.method + "\n" + req.path + "\n" + req.body);
    idem.ttl_s = d.config->idempotency_ttl_s;
    return std::optional<admission::IdempotencyKey>(std::move(idem));
  }

  void SubmitClaim(const httplib::Request& req, httplib::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    if (Status g = WriteGate(*caller); !g.ok()) return Problem(res, req, g);
    if (Status g = DurabilityGate(); !g.ok()) return Problem(res, req, g);
    auto idem = IdempotencyKeyOf(req);
    if (!idem.ok()) return Problem(res, req, idem.status());
    auto j = ParseObject(req, {"body", "workarea_id", "path", "provenance", "simulation_id", "media_type"});
    if (!j.ok()) return Problem(res, req, j.status());
    admission::SubmitRequest sr;
    auto body = StringField(*j, "body", true, /*allow_controls=*/true);
    auto wa = StringField(*j, "workarea_id", true);
    auto path = StringField(*j, "path", true);
    auto prov = StringField(*j, "provenance", true);
    auto sim = StringField(*j, "simulation_id", false);
    auto mt = StringField(*j, "media_type", false);
    for (auto* r : {&body, &wa, &path, &prov, &sim, &mt})
      if (!r->ok()) return Problem(res, req, r->status());
    sr.body = *body;
    sr.workarea_id = *wa;
    sr.path = *path;
    sr.provenance = *prov;
    if (!sim->empty() || (j->contains("simulation_id") && !(*j)["simulation_id"].is_null())) sr.simulation_id = *sim;
    if (!mt->empty()) sr.media_type = *mt;
    if (*idem) {
      auto once = d.claims->SubmitOnce(*caller, sr, **idem,
                                       [](const admission::ClaimMeta& m) { return std::make_pair(201, MetaJson(m)); });
      ForgetIfRevoked(*caller, once.status());
      if (!once.ok()) return Problem(res, req, once.status());
      if (once->replayed) res.set_header("Idempotent-Replayed", "true");
      res.set_header("Location", "/v1/claims/" + once->body["artifact_id"].get<std::string>());
      return Json(res, once->status, once->body);
    }
    auto out = d.claims->Submit(*caller, sr);
    ForgetIfRevoked(*caller, out.status());
    if (!out.ok()) return Problem(res, req, out.status());
    json body_json = MetaJson(out->meta);
    body_json["receipt"] = out->receipt.ToJson();
    res.set_header("Location", "/v1/claims/" + out->meta.artifact_id);
    Json(res, 201, body_json);
  }

  void GetClaim(const httplib::Request& req, httplib::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    auto out = d.claims->Fetch(*caller, req.matches[1]);
    if (!out.ok()) return Problem(res, req, out.status());
    json j = MetaJson(out->meta);
    j["body"] = out->body;
    Json(res, 200, j);
  }

  void EraseClaim(const httplib::Request& req, httplib::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    if (Status g = WriteGate(*caller); !g.ok()) return Problem(res, req, g);
    if (Status g = DurabilityGate(); !g.ok()) return Problem(res, req, g);
    auto idem = IdempotencyKeyOf(req);
    if (!idem.ok()) return Problem(res, req, idem.status());
    std::string reason;
    if (!req.body.empty()) {
      auto j = ParseObject(req, {"reason"});
      if (!j.ok()) return Problem(res, req, j.status());
      auto r = StringField(*j, "reason", false);
      if (!r.ok()) return Problem(res, req, r.status());
      reason = *r;
    }
    if (*idem) {
      auto once = d.claims->EraseOnce(*caller, req.matches[1], reason, **idem,
                                      [](const admission::ClaimMeta& m) { return std::make_pair(200, MetaJson(m)); });
      ForgetIfRevoked(*caller, once.status());
      if (!once.ok()) return Problem(res, req, once.status());
      if (once->replayed) res.set_header("Idempotent-Replayed", "true");
      return Json(res, once->status, once->body);
    }
    auto out = d.claims->Erase(*caller, req.matches[1], reason);
    ForgetIfRevoked(*caller, out.status());
    if (!out.ok()) return Problem(res, req, out.status());
    json j = MetaJson(out->first);
    j["receipt"] = out->second.ToJson();
    Json(res, 200, j);
  }

  void ChainHead(const httplib::Request& req, httplib::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    auto c = d.pool->Acquire();
    if (!c.ok()) return Problem(res, req, c.status());
    auto rs = (*c)->Scoped(caller->tenant_id, {"SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = $1",
                                               {db::Text(caller->tenant_id)}});
    if (!rs.ok()) return Problem(res, req, rs.status());
    const db::Rows& r = *rs;
    if (r.size() == 0) return Problem(res, req, NotFound("tenant has no chain", "not-found"));
    Json(res, 200, {{"tenant", caller->tenant_id}, {"seq", r.GetInt(0, 0)}, {"event_hash", crypto::Hex(r.GetBytes(0, 1))}});
  }

  static Result<int64_t> IntParam(const httplib::Request& req, const char* name, int64_t dflt, int64_t lo, int64_t hi) {
    if (!req.has_param(name)) return dflt;
    std::string v = req.get_param_value(name);
    try {
      size_t pos = 0;
      long long x = std::stoll(v, &pos);
      if (pos != v.size() || x < lo || x > hi) throw std::out_of_range(v);
      return static_cast<int64_t>(x);
    } catch (const std::exception&) {
      return InvalidArgument(std::string("query parameter '") + name + "' must be an integer in [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "]",
                             "invalid-parameter");
    }
  }

  void Events(const httplib::Request& req, httplib::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    auto after = IntParam(req, "after", 0, 0, INT64_MAX);
    if (!after.ok()) return Problem(res, req, after.status());
    auto limit = IntParam(req, "limit", 100, 1, 1000);
    if (!limit.ok()) return Problem(res, req, limit.status());
    auto c = d.pool->Acquire();
    if (!c.ok()) return Problem(res, req, c.status());
    auto rs = (*c)->Scoped(
        caller->tenant_id,
        {"SELECT seq, prev_hash, event_hash, event_type, key_id, signed_bytes, signature, "
         "to_char(committed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') "
         "FROM oml.journal WHERE tenant_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
         {db::Text(caller->tenant_id), db::Int(*after), db::Int(*limit)}});
    if (!rs.ok()) return Problem(res, req, rs.status());
    const db::Rows& r = *rs;
    json events = json::array();
    int64_t last = *after;
    for (int i = 0; i < r.size(); ++i) {
      last = r.GetInt(i, 0);
      events.push_back({{"seq", last},
                        {"prev_hash", crypto::Hex(r.GetBytes(i, 1))},
                        {"event_hash", crypto::Hex(r.GetBytes(i, 2))},
                        {"type", r.Get(i, 3)},
                        {"key_id", r.Get(i, 4)},
                        {"signed_bytes", crypto::Base64(r.GetBytes(i, 5))},
                        {"signature", crypto::Base64(r.GetBytes(i, 6))},
                        {"committed_at", r.Get(i, 7)}});
    }
    Json(res, 200, {{"tenant", caller->tenant_id}, {"events", events}, {"next_after", last}});
  }

  void Health(const httplib::Request& req, httplib::Response& res) {
    json j = {{"status", "ok"}, {"writes", "accepting"}};
    // One query, on one pooled connection: it shows the database answers and the key is in force.
    const Status k = journal::CheckSigningKeyInForce(*d.pool, d.journal->key());
    if (!k.ok() && k.type() != "signing-key-not-in-force") {
      j["status"] = "unavailable";
      j["writes"] = "refused";
      j["database"] = "unreachable";
      return Json(res, 503, j);
    }
    j["database"] = "ok";
    if (!k.ok()) {
      j["status"] = "degraded";
      j["writes"] = "refused";
      j["signing_key"] = "not in force";
    }
    // Unauthenticated: counts only, never tenant ids.
    const size_t forked = d.fork->ClosedCount();
    const bool provider_forked = d.fork->ProviderClosed();
    j["forked_tenants"] = forked;
    if (forked > 0) {
      j["status"] = "degraded";
      if (j["writes"] == "accepting") j["writes"] = provider_forked ? "refused" : "refused for forked tenants";
    }
    // Durability: ok | insufficient (every write refused) | reduced | reduced (local profile).
    if (d.durability) {
      const db::DurabilityMonitor::State ds = d.durability->Get();
      j["durability"] = db::DurabilityMonitor::HealthValue(ds);
      j["durability_detail"] = ds.detail;  // names neither tenants nor standbys
      if (j["durability"] == "insufficient") {
        j["status"] = "degraded";
        j["writes"] = "refused";
      }
    }
    Json(res, 200, j);
  }

  void Routes() {
    auto wrap = [this](const char* route, void (Impl::*fn)(const httplib::Request&, httplib::Response&)) {
      return [this, route, fn](const httplib::Request& req, httplib::Response& res) {
        auto t0 = Clock::now();
        (this->*fn)(req, res);
        Metrics::Get().Request(req.method, route, res.status,
                               std::chrono::duration<double>(Clock::now() - t0).count());
      };
    };
    http.Post("/v1/claims", wrap("/v1/claims", &Impl::SubmitClaim));
    http.Get(R"(/v1/claims/([^/]+))", wrap("/v1/claims/{id}", &Impl::GetClaim));
    http.Post(R"(/v1/claims/([^/]+)/erase)", wrap("/v1/claims/{id}/erase", &Impl::EraseClaim));
    http.Get("/v1/chain/head", wrap("/v1/chain/head", &Impl::ChainHead));
    http.Get("/v1/events", wrap("/v1/events", &Impl::Events));
    http.Get("/v1/health", wrap("/v1/health", &Impl::Health));
    http.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(Metrics::Get().Serialize(), "text/plain; version=0.0.4");
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      Status s = res.status == 413   ? Status(Code::kPayloadTooLarge, "request body too large", "body-too-large")
                 : res.status == 404 ? NotFound("no such route " + req.method + " " + req.path, "no-route")
                 : res.status == 400 ? InvalidArgument("malformed HTTP request", "malformed-request")
                                     : Internal("HTTP error " + std::to_string(res.status));
      int st = res.status;
      res.set_content(ProblemJson(s, req.path), "application/problem+json");
      res.status = st;
    });
    http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      Problem(res, req, Internal("unhandled exception: " + what));
    });
    // JSON escaping can grow a text body up to 6x; the decoded body limit is enforced in Submit.
    http.set_payload_max_length(d.config->max_body_bytes * 6 + 64 * 1024);
    int threads = d.config->http_threads;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http.set_keep_alive_max_count(10000);
    // Responses go out as several small writes; without TCP_NODELAY, Nagle plus the client's
    // delayed ACK add ~40 ms to every keep-alive request.
    http.set_tcp_nodelay(true);
  }
};

Server::Server(ServerDeps deps) : impl_(std::make_unique<Impl>(deps)) { impl_->Routes(); }
Server::~Server() = default;

Status Server::Listen(const std::string& host, int port) {
  if (!impl_->http.bind_to_port(host.c_str(), port))
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port));
  log::Info("listening", {{"address", host + ":" + std::to_string(port)}});
  if (!impl_->http.listen_after_bind()) return Internal("HTTP server stopped with an error");
  return Status::Ok();
}

void Server::Stop() { impl_->http.stop(); }

}  // namespace oml::api
