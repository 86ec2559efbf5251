#include "api/server.h"
#include "common/json_escape.h"

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "api/http.h"
#include "api/attachments_handlers.h"
#include "api/recall_handlers.h"
#include "api/lifecycle_handlers.h"
#include "api/uploads_handlers.h"

#include "common/log.h"
#include "common/metrics.h"
#include "admission/events.h"
#include "crypto/crypto.h"
#include "journal/provider.h"
#include "journal/tlog_store.h"
#include "merkle/merkle.h"
#include "tlog/checkpoint.h"

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
  // tus (api/uploads_handlers.h): statuses the protocol fixes.
  if (s.type() == "checksum-mismatch") return 460;
  if (s.type() == "digest-mismatch") return 422;
  if (s.type() == "tus-version-unsupported") return 412;
  if (s.type() == "upload-quota-exceeded") return 429;
  if (s.type() == "unsupported-media-type") return 415;
  // Attachments (admission/attachments.h): a Range past the end.
  if (s.type() == "range-not-satisfiable") return 416;
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

// Thrown by the JSON parser's callback at the first value nested deeper than kMaxJsonDepth, so
// that a body of six million '[' is refused before its arrays are built.
struct TooDeep {};
constexpr int kMaxJsonDepth = 32;

struct Server::Impl {
  ServerDeps d;
  std::unique_ptr<http::Server> api_http;
  std::unique_ptr<http::Server> metrics_http;
  std::thread metrics_thread;
  // Reassignment and simulations (api/lifecycle_handlers.h), over d.journal, d.pool, d.claims.
  std::unique_ptr<admission::Lifecycle> lifecycle;

  // API-key cache: token hash -> (caller, expiry). Revocation takes effect within kAuthTtl for
  // reads; a write checks the key in its own transaction, and its 401 evicts the entry
  // (ForgetIfRevoked).
  static constexpr auto kAuthTtl = std::chrono::seconds(10);
  std::mutex auth_mu;
  std::map<std::string, std::pair<admission::Caller, Clock::time_point>> auth_cache;
  // Tokens the database did not know, for kUnknownTtl: a client retrying a bad token costs no
  // database round trip. Bounded: cleared when it reaches kCacheMax entries.
  static constexpr auto kUnknownTtl = std::chrono::seconds(5);
  static constexpr size_t kCacheMax = 100000;
  static constexpr auto kAuthWait = std::chrono::milliseconds(50);
  // How long past kAuthTtl a known key is still honoured when its re-lookup finds the pool's
  // token-lookup share busy (reads only: writes check the key in their own transaction).
  static constexpr auto kAuthStale = std::chrono::seconds(60);
  std::map<std::string, Clock::time_point> unknown_cache;

  explicit Impl(ServerDeps deps) : d(deps) {}

  void Problem(http::Response& res, const http::Request& req, const Status& s) {
    res.status = HttpStatus(s);
    // Transient database states: the client may retry after a second.
    if (s.type() == "database-busy" || s.type() == "transaction-conflict" || s.type() == "query-canceled")
      res.SetHeader("Retry-After", "1");
    // Over an upload quota (uploads.h Options): open sessions end when they complete, are
    // deleted or expire; a minute is a hint, not a promise.
    if (s.type() == "upload-quota-exceeded") res.SetHeader("Retry-After", "60");
    if (s.type() == "pdf-extraction-busy") res.SetHeader("Retry-After", "1");
    // Internal and database errors are logged in full; clients get no SQL, hosts or role names.
    Status shown = s;
    if (s.code() == Code::kInternal && s.type() != "injected-fault") {
      shown = Status(s.code(), "internal error; the server log has the details", s.type());
    } else if (s.type() == "database-unavailable") {
      shown = Status(s.code(), "the database is unavailable; retry later", s.type());
    }
    res.content_type = "application/problem+json";
    res.body = ProblemJson(shown, req.path);
    // ToString() carries the database's own text (Status::log_detail), which never reaches the
    // client: every problem that has one is logged with it.
    if (s.code() == Code::kInternal || s.code() == Code::kDataLoss || s.code() == Code::kUnavailable)
      log::Error("request failed", {{"path", req.path}, {"error", s.ToString()}});
    else if (!s.log_detail().empty())
      log::Warn("request refused", {{"path", req.path}, {"error", s.ToString()}});
  }

  void Json(http::Response& res, int status, const json& body) {
    res.status = status;
    res.content_type = "application/json";
    res.body = body.dump();
  }

  // After a write: a 401 from admission means the write's transaction found the key revoked.
  void ForgetIfRevoked(const admission::Caller& c, const Status& s) {
    if (s.code() != Code::kUnauthenticated) return;
    std::lock_guard<std::mutex> l(auth_mu);
    auth_cache.erase(c.api_key_hash);
  }

  Result<admission::Caller> Authenticate(const http::Request& req) {
    if (req.HeaderCount("Authorization") > 1) return Unauthenticated("more than one Authorization field", "unauthenticated");
    std::string h = req.Header("Authorization").value_or("");
    const std::string prefix = "Bearer ";
    if (h.size() <= prefix.size() || h.compare(0, prefix.size(), prefix) != 0)
      return Unauthenticated("missing bearer token", "unauthenticated");
    std::string token = h.substr(prefix.size());
    std::string hash = crypto::Sha256(token);
    std::optional<admission::Caller> stale;  // a known key whose cache entry is past kAuthTtl
    {
      std::lock_guard<std::mutex> l(auth_mu);
      const auto now = Clock::now();
      auto it = auth_cache.find(hash);
      if (it != auth_cache.end()) {
        if (it->second.second > now) return it->second.first;
        if (it->second.second + kAuthStale > now) stale = it->second.first;
      }
      auto u = unknown_cache.find(hash);
      if (u != unknown_cache.end() && u->second > now) return Unauthenticated("unknown or revoked API key", "unauthenticated");
    }
    Result<db::Rows> r = [&]() -> Result<db::Rows> {
      // Lookups of tokens not in the cache share at most a quarter of the pool and wait for a
      // connection at most kAuthWait: a flood of random tokens leaves the rest of the pool to
      // callers already known, and does not hold the worker threads.
      db::Pool::ScopedShare share("auth", std::max(1, d.pool->size() / 4), kAuthWait);
      OML_ASSIGN_OR_RETURN(db::Pool::Handle c, d.pool->Acquire());
      return c->Query("SELECT tenant_id, principal, role FROM oml.authenticate($1)", {db::Bytes(hash)});
    }();
    // While lookups are crowded out (a flood of unknown tokens), a key known within
    // kAuthStale keeps working: its writes still check it in their own transaction.
    if (!r.ok() && r.status().type() == "database-busy" && stale) return *stale;
    if (!r.ok()) return r.status();
    if (r->size() == 0 || r->IsNull(0, 0)) {
      std::lock_guard<std::mutex> l(auth_mu);
      auth_cache.erase(hash);
      if (unknown_cache.size() >= kCacheMax) unknown_cache.clear();
      unknown_cache[hash] = Clock::now() + kUnknownTtl;
      return Unauthenticated("unknown or revoked API key", "unauthenticated");
    }
    admission::Caller caller{r->Get(0, 0), r->Get(0, 1), r->Get(0, 2), journal::ApiKeyId(hash), hash};
    std::lock_guard<std::mutex> l(auth_mu);
    unknown_cache.erase(hash);
    if (auth_cache.size() >= kCacheMax) auth_cache.clear();
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
            // admission/lifecycle.h: a claim made under a simulation has provenance class "simulation".
            {"provenance_class", m.simulation_id ? std::string("simulation") : m.provenance},
            {"simulation_id", m.simulation_id ? json(*m.simulation_id) : json(nullptr)},
            {"media_type", m.media_type},
            {"size", m.size},
            {"plaintext_sha256", crypto::Hex(m.plaintext_sha256)},
            {"ciphertext_sha256", crypto::Hex(m.ciphertext_sha256)},
            {"submitted_seq", m.submitted_seq},
            {"erased_seq", m.erased_seq ? json(*m.erased_seq) : json(nullptr)},
            {"promoted_seq", m.promoted_seq ? json(*m.promoted_seq) : json(nullptr)},
            {"rejected_seq", m.rejected_seq ? json(*m.rejected_seq) : json(nullptr)},
            {"demoted_seq", m.demoted_seq ? json(*m.demoted_seq) : json(nullptr)},
            {"review", m.body_review}};
  }

  // Parses a JSON object body allowing only `allowed` members.
  Result<json> ParseObject(const http::Request& req, const std::set<std::string>& allowed) {
    json j;
    try {
      j = json::parse(
          req.body,
          [](int depth, json::parse_event_t event, json&) {
            if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
                depth >= kMaxJsonDepth)
              throw TooDeep{};
            return true;
          },
          /*allow_exceptions=*/false);
    } catch (const TooDeep&) {
      return InvalidArgument("request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels", "json-too-deep");
    }
    if (j.is_discarded()) return InvalidArgument("request body is not valid JSON", "malformed-json");
    if (!j.is_object()) return InvalidArgument("request body must be a JSON object", "malformed-json");
    for (auto& [k, v] : j.items())
      if (!allowed.count(k)) return InvalidArgument("unknown field '" + k + "'", "unknown-field");
    return j;
  }

  // A string member: present (or absent when not required) and a JSON string. Its content rules
  // (length, syntax, no control characters in metadata) are fields/fields.h's, applied by
  // Claims for the API and the CLI alike.
  static Result<std::string> StringField(const json& j, const char* name, bool required) {
    if (!j.contains(name) || j[name].is_null()) {
      if (required) return InvalidArgument(std::string("missing field '") + name + "'", "missing-field");
      return std::string();
    }
    if (!j[name].is_string()) return InvalidArgument(std::string("field '") + name + "' must be a string", "invalid-field");
    return j[name].get<std::string>();
  }

  // A write's optional Idempotency-Key (IETF httpapi draft "The Idempotency-Key HTTP Header
  // Field"): one field line holding an RFC 8941 sf-string, i.e. a quoted string of printable
  // ASCII in which only \" and \\ are escaped, of 1..255 characters once unescaped. No
  // parameters. Anything else is 400 invalid-idempotency-key. The request fingerprint is
  // SHA-256(method "\n" path "\n" exact body bytes). nullopt without the header.
  Result<std::optional<admission::IdempotencyKey>> IdempotencyKeyOf(const http::Request& req) {
    static const char* kField = "Idempotency-Key";
    if (req.HeaderCount(kField) == 0) return std::optional<admission::IdempotencyKey>();
    auto bad = [](const std::string& why) { return InvalidArgument("Idempotency-Key " + why, "invalid-idempotency-key"); };
    if (req.HeaderCount(kField) != 1) return bad("must be sent once");
    const std::string v = *req.Header(kField);
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

  void SubmitClaim(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    if (Status g = WriteGate(*caller); !g.ok()) return Problem(res, req, g);
    if (Status g = DurabilityGate(); !g.ok()) return Problem(res, req, g);
    auto idem = IdempotencyKeyOf(req);
    if (!idem.ok()) return Problem(res, req, idem.status());
    auto j = ParseObject(req, {"body", "workarea_id", "path", "provenance", "simulation_id", "media_type", "attachments"});
    if (!j.ok()) return Problem(res, req, j.status());
    admission::SubmitRequest sr;
    if (j->contains("attachments") && !(*j)["attachments"].is_null()) {
      const json& a = (*j)["attachments"];
      if (!a.is_array())
        return Problem(res, req, InvalidArgument("field 'attachments' must be an array of upload ids", "invalid-field"));
      for (const auto& id : a) {
        if (!id.is_string())
          return Problem(res, req, InvalidArgument("field 'attachments' must be an array of upload ids", "invalid-field"));
        sr.attachments.push_back(id.get<std::string>());
      }
    }
    auto body = StringField(*j, "body", true);
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
      if (once->replayed) res.SetHeader("Idempotent-Replayed", "true");
      res.SetHeader("Location", "/v1/claims/" + once->body["artifact_id"].get<std::string>());
      return Json(res, once->status, once->body);
    }
    auto out = d.claims->Submit(*caller, sr);
    ForgetIfRevoked(*caller, out.status());
    if (!out.ok()) return Problem(res, req, out.status());
    json body_json = MetaJson(out->meta);
    body_json["receipt"] = out->receipt.ToJson();
    res.SetHeader("Location", "/v1/claims/" + out->meta.artifact_id);
    Json(res, 201, body_json);
  }

  // GET (and HEAD) /v1/claims/{id}: the claim's metadata, attachments and body as one JSON
  // object. A body kept as an object (sql/0015) is streamed (issue 19): a first pass decrypts and
  // checks it piece by piece to learn its JSON-escaped length (and, for a reviewer of a held
  // claim, before review.served is journalled), a second sends it; "body" is then the last key.
  // Memory per response: one piece, whatever the body's size.
  void GetClaim(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    auto out = d.claims->FetchStreamed(*caller, req.captures[0]);
    if (!out.ok()) return Problem(res, req, out.status());
    admission::Attachments* atts = d.claims->attachments();
    // A serve that journals is gated before anything is read (HEAD journals nothing).
    const bool serves = atts != nullptr && req.method != "HEAD";
    if (serves) {
      if (Status g = ServeGate(*caller, out->meta); !g.ok()) return Problem(res, req, g);
    }
    uint64_t escaped_size = 0;
    if (out->streamed) {
      Status pass = [&]() -> Status {
        OML_ASSIGN_OR_RETURN(admission::PieceReader reader, out->open());
        for (;;) {
          OML_ASSIGN_OR_RETURN(std::string piece, reader());
          if (piece.empty()) return Status::Ok();
          escaped_size += JsonEscapedSize(piece);
          crypto::Wipe(&piece);
        }
      }();
      if (!pass.ok()) {
        // Erased (or gone otherwise) since the row was read: answer what the claim is now.
        auto again = d.claims->FetchStreamed(*caller, req.captures[0]);
        return Problem(res, req, again.ok() ? pass : again.status());
      }
    }
    json j = MetaJson(out->meta);
    if (atts != nullptr) {
      // Serving a held claim's body to a reviewer journals review.served (item 0), after the body
      // was decrypted and checked and before a byte of it is sent.
      if (serves) {
        Status served = atts->RecordServed(*caller, out->meta, 0, out->meta.plaintext_sha256, out->meta.ciphertext_sha256);
        if (!served.ok()) return Problem(res, req, served);
      }
      auto list = atts->List(caller->tenant_id, out->meta.artifact_id, out->meta.version);
      if (!list.ok()) return Problem(res, req, list.status());
      j["attachments"] = json::array();
      for (const auto& a : *list) j["attachments"].push_back(AttachmentJson(a));
    }
    if (!out->streamed) {
      j["body"] = std::move(out->body);
      return Json(res, 200, j);
    }
    // {<metadata>,"body":"<escaped pieces>"}: the head, each piece of a second pass, the tail.
    struct BodyStream {
      std::string head, tail = "\"}";
      std::function<Result<admission::PieceReader>()> open;
      admission::PieceReader reader;
      int stage = 0;  // 0 head, 1 body, 2 tail, 3 done
    };
    auto st = std::make_shared<BodyStream>();
    st->head = j.dump();
    st->head.pop_back();  // the closing brace
    st->head += ",\"body\":\"";
    st->open = std::move(out->open);
    res.status = 200;
    res.content_type = "application/json";
    res.stream_length = st->head.size() + escaped_size + st->tail.size();
    res.stream = [st]() -> Result<std::string> {
      for (;;) {
        switch (st->stage) {
          case 0:
            st->stage = 1;
            return std::move(st->head);
          case 1: {
            if (!st->reader) {
              OML_ASSIGN_OR_RETURN(st->reader, st->open());
            }
            OML_ASSIGN_OR_RETURN(std::string piece, st->reader());
            if (piece.empty()) {
              st->stage = 2;
              continue;
            }
            std::string escaped = JsonEscaped(piece);
            crypto::Wipe(&piece);
            return escaped;
          }
          case 2:
            st->stage = 3;
            return std::move(st->tail);
          default:
            return std::string();
        }
      }
    };
  }

  // Every 416 names the file's size (RFC 9110 §15.5.17): Content-Range: bytes */<size>.
  static void SetUnsatisfiedRange(admission::Attachments& atts, const admission::Caller& c,
                                  const admission::ClaimMeta& m, int ordinal, http::Response& res) {
    auto list = atts.List(c.tenant_id, m.artifact_id, m.version);
    if (list.ok())
      for (const auto& a : *list)
        if (a.ordinal == ordinal) res.SetHeader("Content-Range", "bytes */" + std::to_string(a.size));
  }

  // A serve that journals review.served (a reviewer or admin reading a held claim) is a write:
  // it passes the write and durability gates.
  Status ServeGate(const admission::Caller& c, const admission::ClaimMeta& m) {
    if ((c.role != "reviewer" && c.role != "admin") || m.state != "held") return Status::Ok();
    OML_RETURN_IF_ERROR(WriteGate(c));
    return DurabilityGate();
  }

  // GET /v1/claims/{id}/attachments/{n}: api/attachments_handlers.h.
  void GetAttachment(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    admission::Attachments* atts = d.claims->attachments();
    const int ordinal = std::atoi(req.captures[1].c_str());  // the route takes 1..3 digits
    if (atts == nullptr || ordinal < 1 || ordinal > admission::kMaxAttachments)
      return Problem(res, req, NotFound("no attachment " + req.captures[1], "attachment-not-found"));
    auto range = ParseRange(req);
    auto claim = d.claims->Fetch(*caller, req.captures[0]);  // visibility (404) and erasure (410)
    if (!claim.ok()) return Problem(res, req, claim.status());
    if (!range.ok()) {
      Problem(res, req, range.status());
      return SetUnsatisfiedRange(*atts, *caller, claim->meta, ordinal, res);
    }
    crypto::Wipe(&claim->body);
    // A HEAD serves nothing: the header of the answer a GET would get, nothing read or journalled.
    if (req.method == "HEAD") {
      auto head = atts->Describe(*caller, claim->meta, ordinal, *range);
      if (!head.ok()) {
        Problem(res, req, head.status());
        if (head.status().type() == "range-not-satisfiable") SetUnsatisfiedRange(*atts, *caller, claim->meta, ordinal, res);
        return;
      }
      AttachmentResponse(*head, res);
      return;
    }
    if (Status g = ServeGate(*caller, claim->meta); !g.ok()) return Problem(res, req, g);
    auto served = atts->Serve(*caller, claim->meta, ordinal, *range);
    if (!served.ok()) {
      Problem(res, req, served.status());
      if (served.status().type() == "range-not-satisfiable") SetUnsatisfiedRange(*atts, *caller, claim->meta, ordinal, res);
      return;
    }
    AttachmentResponse(*served, res);
  }

  void EraseClaim(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
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
      auto once = d.claims->EraseOnce(*caller, req.captures[0], reason, **idem,
                                      [](const admission::ClaimMeta& m) { return std::make_pair(200, MetaJson(m)); });
      ForgetIfRevoked(*caller, once.status());
      if (!once.ok()) return Problem(res, req, once.status());
      if (once->replayed) res.SetHeader("Idempotent-Replayed", "true");
      return Json(res, once->status, once->body);
    }
    auto out = d.claims->Erase(*caller, req.captures[0], reason);
    ForgetIfRevoked(*caller, out.status());
    if (!out.ok()) return Problem(res, req, out.status());
    json j = MetaJson(out->first);
    j["receipt"] = out->second.ToJson();
    Json(res, 200, j);
  }

  // POST /v1/claims/{id}/verdict {"verdict": "accept"|"reject", "reason"?} and
  // POST /v1/claims/{id}/demote {"reason"?}: admission::Claims::Review. Checks in the order of
  // EraseClaim; the verdict member is checked with the body (400 missing-field / invalid-field).
  void ReviewClaim(const http::Request& req, http::Response& res, bool demote) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    if (Status g = WriteGate(*caller); !g.ok()) return Problem(res, req, g);
    if (Status g = DurabilityGate(); !g.ok()) return Problem(res, req, g);
    auto idem = IdempotencyKeyOf(req);
    if (!idem.ok()) return Problem(res, req, idem.status());
    admission::ReviewAct act = admission::ReviewAct::kDemote;
    std::string reason;
    if (!demote || !req.body.empty()) {
      auto j = demote ? ParseObject(req, {"reason"}) : ParseObject(req, {"verdict", "reason"});
      if (!j.ok()) return Problem(res, req, j.status());
      if (!demote) {
        auto v = StringField(*j, "verdict", true);
        if (!v.ok()) return Problem(res, req, v.status());
        auto a = admission::ParseVerdict(*v);
        if (!a.ok()) return Problem(res, req, a.status());
        act = *a;
      }
      auto r = StringField(*j, "reason", false);
      if (!r.ok()) return Problem(res, req, r.status());
      reason = *r;
    }
    if (*idem) {
      auto once = d.claims->ReviewOnce(*caller, req.captures[0], act, reason, **idem,
                                       [](const admission::ClaimMeta& m) { return std::make_pair(200, MetaJson(m)); });
      ForgetIfRevoked(*caller, once.status());
      if (!once.ok()) return Problem(res, req, once.status());
      if (once->replayed) res.SetHeader("Idempotent-Replayed", "true");
      return Json(res, once->status, once->body);
    }
    auto out = d.claims->Review(*caller, req.captures[0], act, reason);
    ForgetIfRevoked(*caller, out.status());
    if (!out.ok()) return Problem(res, req, out.status());
    json j = MetaJson(out->first);
    j["receipt"] = out->second.ToJson();
    Json(res, 200, j);
  }
  void VerdictClaim(const http::Request& req, http::Response& res) { ReviewClaim(req, res, false); }
  void DemoteClaim(const http::Request& req, http::Response& res) { ReviewClaim(req, res, true); }

  // GET /v1/claims and GET /v1/search: api/recall_handlers.h (reads only).
  void Recall(const http::Request& req, http::Response& res, bool search) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    auto page = search ? SearchClaimsJson(*d.pool, *d.cursor_keys, *caller, req, &MetaJson)
                       : RecallClaimsJson(*d.pool, *d.cursor_keys, *caller, req, &MetaJson);
    if (!page.ok()) return Problem(res, req, page.status());
    Json(res, 200, *page);
  }
  void ListClaims(const http::Request& req, http::Response& res) { Recall(req, res, false); }
  void SearchClaims(const http::Request& req, http::Response& res) { Recall(req, res, true); }

  void ChainHead(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    auto c = d.pool->Acquire();
    if (!c.ok()) return Problem(res, req, c.status());
    auto rs = (*c)->Scoped(caller->tenant_id, {"SELECT seq, event_hash FROM oml.chain_heads WHERE tenant_id = $1",
                                               {db::Text(caller->tenant_id)}});
    if (!rs.ok()) return Problem(res, req, rs.status());
    const db::Rows& r = *rs;
    if (r.size() == 0) return Problem(res, req, NotFound("tenant has no chain", "not-found"));
    Json(res, 200, {{"tenant", caller->tenant_id}, {"seq", r.GetInt(0, 0)}, {"event_hash", crypto::Hex(r.GetBytes(0, 1))}});
  }

  static Result<int64_t> IntParam(const http::Request& req, const char* name, int64_t dflt, int64_t lo, int64_t hi) {
    auto p = req.Param(name);
    if (!p) return dflt;
    const std::string& v = *p;
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

  void Events(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    auto after = IntParam(req, "after", 0, 0, INT64_MAX);
    if (!after.ok()) return Problem(res, req, after.status());
    auto limit = IntParam(req, "limit", 100, 1, 1000);
    if (!limit.ok()) return Problem(res, req, limit.status());
    // Who sees what: admission/events.h (the own-work rule holds for the chain too).
    auto page = admission::ListEvents(*d.pool, *caller, *after, static_cast<int>(*limit), d.config->events_page_max_bytes);
    if (!page.ok()) return Problem(res, req, page.status());
    json events = json::array();
    for (const admission::EventRow& e : page->events) {
      events.push_back({{"seq", e.seq},
                        {"prev_hash", crypto::Hex(e.prev_hash)},
                        {"event_hash", crypto::Hex(e.event_hash)},
                        {"type", e.type},
                        {"key_id", e.key_id},
                        {"signed_bytes", crypto::Base64(e.signed_bytes)},
                        {"signature", crypto::Base64(e.signature)},
                        {"committed_at", e.committed_at}});
    }
    const int64_t last = page->next_after;
    Json(res, 200, {{"tenant", caller->tenant_id}, {"events", events}, {"next_after", last}});
  }

  // GET /v1/proofs/inclusion?seq=N (issue 23): the event's inclusion proof against the chain's
  // newest signed checkpoint, as a C2SP tlog-proof (text/plain). Who may ask for which seq: the
  // rule of GET /v1/events (admission/events.h); an event the caller may not read is 404, as an
  // event that does not exist. 409 not-checkpointed (Retry-After: 1) while the newest checkpoint
  // does not cover the seq yet (journal::TlogPublisher signs one about a second after a commit).
  void InclusionProof(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);
    if (!req.Param("seq")) return Problem(res, req, InvalidArgument("query parameter 'seq' is required", "invalid-parameter"));
    auto seq = IntParam(req, "seq", 0, 1, INT64_MAX);
    if (!seq.ok()) return Problem(res, req, seq.status());
    auto page = admission::ListEvents(*d.pool, *caller, *seq - 1, 1, d.config->events_page_max_bytes);
    if (!page.ok()) return Problem(res, req, page.status());
    if (page->events.empty() || page->events[0].seq != *seq)
      return Problem(res, req, NotFound("no event at seq " + std::to_string(*seq) + " that this key may read", "not-found"));
    auto c = d.pool->Acquire();
    if (!c.ok()) return Problem(res, req, c.status());
    auto st = journal::ReadTlogState(**c, caller->tenant_id);
    if (!st.ok()) return Problem(res, req, st.status());
    if (!st->checkpoint_size || *st->checkpoint_size < *seq) {
      res.SetHeader("Retry-After", "1");
      return Problem(res, req,
                     FailedPrecondition("seq " + std::to_string(*seq) + " is not in the newest checkpoint yet (size " +
                                            std::to_string(st->checkpoint_size.value_or(0)) +
                                            "); a checkpoint is signed about a second after a commit: retry",
                                        "not-checkpointed"));
    }
    journal::TileReader tiles(&**c, caller->tenant_id);
    if (Status pf = tiles.Prefetch(static_cast<uint64_t>(*seq - 1), static_cast<uint64_t>(*st->checkpoint_size)); !pf.ok())
      return Problem(res, req, pf);
    auto path = merkle::InclusionProof(tiles, static_cast<uint64_t>(*seq - 1), static_cast<uint64_t>(*st->checkpoint_size));
    if (!path.ok()) return Problem(res, req, path.status());
    tlog::TlogProof p;
    p.index = static_cast<uint64_t>(*seq - 1);
    p.hashes = std::move(*path);
    p.checkpoint = st->checkpoint;
    res.status = 200;
    res.content_type = "text/plain; charset=utf-8";
    res.body = tlog::EncodeTlogProof(p);
  }

  // GET /v1/proofs/consistency?from=M[&to=N] (issue 23): RFC 9162 PROOF(M, D[N]) between two
  // sizes of the caller's chain, N at most the newest checkpoint's size (default: it), with that
  // checkpoint. Any key of the tenant: the proof holds hashes only.
  void ConsistencyProof(const http::Request& req, http::Response& res) {
    auto caller = Authenticate(req);
    if (!caller.ok()) return Problem(res, req, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);
    if (!req.Param("from")) return Problem(res, req, InvalidArgument("query parameter 'from' is required", "invalid-parameter"));
    auto from = IntParam(req, "from", 0, 0, INT64_MAX);
    if (!from.ok()) return Problem(res, req, from.status());
    auto c = d.pool->Acquire();
    if (!c.ok()) return Problem(res, req, c.status());
    auto st = journal::ReadTlogState(**c, caller->tenant_id);
    if (!st.ok()) return Problem(res, req, st.status());
    const int64_t newest = st->checkpoint_size.value_or(0);
    auto to = IntParam(req, "to", newest, 0, INT64_MAX);
    if (!to.ok()) return Problem(res, req, to.status());
    if (req.Param("to") && *from > *to)
      return Problem(res, req, InvalidArgument("'from' (" + std::to_string(*from) + ") is past 'to' (" + std::to_string(*to) + ")",
                                               "invalid-parameter"));
    if (const int64_t past = std::max(*from, *to); !st->checkpoint_size || past > newest) {
      res.SetHeader("Retry-After", "1");
      return Problem(res, req, FailedPrecondition("size " + std::to_string(past) + " is past the newest checkpoint (size " +
                                                      std::to_string(newest) + ")",
                                                  "not-checkpointed"));
    }
    journal::TileReader tiles(&**c, caller->tenant_id);
    if (Status pf = tiles.Prefetch(static_cast<uint64_t>(*from), static_cast<uint64_t>(*to), static_cast<uint64_t>(*from));
        !pf.ok())
      return Problem(res, req, pf);
    auto proof = merkle::ConsistencyProof(tiles, static_cast<uint64_t>(*from), static_cast<uint64_t>(*to));
    if (!proof.ok()) return Problem(res, req, proof.status());
    json hashes = json::array();
    for (const auto& h : *proof) hashes.push_back(crypto::Base64(h));
    Json(res, 200, {{"from", *from}, {"to", *to}, {"hashes", hashes}, {"checkpoint", st->checkpoint}});
  }

  void Health(const http::Request& req, http::Response& res) {
    json j = {{"status", "ok"}, {"writes", "accepting"}};
    // One query, on one pooled connection: it shows the database answers and the key is in force.
    // Unauthenticated, so it gets one connection of its own share and waits briefly: a flood of
    // health checks cannot take the pool.
    Status k;
    {
      db::Pool::ScopedShare share("health", 1, std::chrono::milliseconds(200));
      k = journal::CheckSigningKeyInForce(*d.pool, d.journal->key());
    }
    if (k.type() == "database-busy") {
      j["status"] = "busy";
      j["database"] = "busy";
      return Json(res, 503, j);
    }
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
      // The standbys streaming now: ok | below-quorum (commits wait, then 503
      // commit-not-replicated) | unknown | none (no synchronous standbys configured).
      j["replication"] = ds.standbys.HealthValue();
      j["replication_detail"] = ds.standbys.Describe();
      if (ds.standbys.BelowQuorum()) j["status"] = "degraded";
      if (j["durability"] == "insufficient") {
        j["status"] = "degraded";
        j["writes"] = "refused";
      }
    }
    Json(res, 200, j);
  }

  // The API listener. /metrics is not here: it has its own listener (metrics_listen).
  std::vector<http::Route> ApiRoutes() {
    auto bind = [this](void (Impl::*fn)(const http::Request&, http::Response&)) {
      return [this, fn](const http::Request& req, http::Response& res) { (this->*fn)(req, res); };
    };
    using BP = http::BodyPolicy;
    std::vector<http::Route> routes = {
        {"POST", "/v1/claims", "/v1/claims", BP::kRequired, bind(&Impl::SubmitClaim)},
        {"GET", "/v1/claims", "/v1/claims", BP::kNone, bind(&Impl::ListClaims)},
        {"GET", "/v1/search", "/v1/search", BP::kNone, bind(&Impl::SearchClaims)},
        {"GET", "/v1/claims/([^/]+)", "/v1/claims/{id}", BP::kNone, bind(&Impl::GetClaim)},
        {"GET", "/v1/claims/([^/]+)/attachments/([0-9]{1,3})", "/v1/claims/{id}/attachments/{n}", BP::kNone,
         bind(&Impl::GetAttachment)},
        {"POST", "/v1/claims/([^/]+)/erase", "/v1/claims/{id}/erase", BP::kOptional, bind(&Impl::EraseClaim)},
        {"POST", "/v1/claims/([^/]+)/verdict", "/v1/claims/{id}/verdict", BP::kRequired, bind(&Impl::VerdictClaim)},
        {"POST", "/v1/claims/([^/]+)/demote", "/v1/claims/{id}/demote", BP::kOptional, bind(&Impl::DemoteClaim)},
        {"GET", "/v1/chain/head", "/v1/chain/head", BP::kNone, bind(&Impl::ChainHead)},
        {"GET", "/v1/events", "/v1/events", BP::kNone, bind(&Impl::Events)},
        {"GET", "/v1/proofs/inclusion", "/v1/proofs/inclusion", BP::kNone, bind(&Impl::InclusionProof)},
        {"GET", "/v1/proofs/consistency", "/v1/proofs/consistency", BP::kNone, bind(&Impl::ConsistencyProof)},
        {"GET", "/v1/health", "/v1/health", BP::kNone, bind(&Impl::Health)},
    };
    if (d.uploads != nullptr) {
      UploadHooks hooks{[this](const http::Request& req) { return Authenticate(req); },
                        [this](const admission::Caller& c) {
                          if (Status g = WriteGate(c); !g.ok()) return g;
                          return DurabilityGate();
                        },
                        [this](http::Response& res, const http::Request& req, const Status& s) { Problem(res, req, s); },
                        [this](const admission::Caller& c, const Status& s) { ForgetIfRevoked(c, s); }};
      for (auto& r : UploadRoutes(d.uploads, std::move(hooks))) routes.push_back(std::move(r));
    }
    lifecycle = std::make_unique<admission::Lifecycle>(d.journal, d.pool, d.claims);
    LifecycleHooks lh{[this](const http::Request& req) { return Authenticate(req); },
                      [this](const admission::Caller& c) {
                        if (Status g = WriteGate(c); !g.ok()) return g;
                        return DurabilityGate();
                      },
                      [this](http::Response& res, const http::Request& req, const Status& s) { Problem(res, req, s); },
                      [this](const admission::Caller& c, const Status& s) { ForgetIfRevoked(c, s); },
                      [this](const http::Request& req, const std::set<std::string>& allowed) { return ParseObject(req, allowed); },
                      &MetaJson};
    for (auto& r : LifecycleRoutes(lifecycle.get(), std::move(lh))) routes.push_back(std::move(r));
    return routes;
  }

  static http::Response TransportProblem(int status, const std::string& slug, const std::string& detail,
                                         const std::string& path) {
    json j = {{"type", "urn:oml:problem:" + slug}, {"title", slug}, {"status", status}, {"detail", detail}, {"instance", path}};
    http::Response r;
    r.status = status;
    r.content_type = "application/problem+json";
    r.body = j.dump();
    if (path.rfind("/v1/uploads", 0) == 0) r.SetHeader("Tus-Resumable", "1.0.0");  // tus: on every response
    return r;
  }

  http::Limits ApiLimits() const {
    const Config& c = *d.config;
    http::Limits l;
    l.max_body_bytes = c.http_max_request_bytes;
    l.max_header_bytes = static_cast<uint32_t>(c.http_max_header_bytes);
    l.request_timeout = std::chrono::milliseconds(c.http_request_timeout_ms);
    l.write_timeout = std::chrono::milliseconds(c.http_request_timeout_ms);
    l.max_requests_per_connection = static_cast<uint32_t>(c.http_keepalive_requests);
    l.max_connections = static_cast<uint32_t>(c.http_max_connections);
    l.worker_threads = c.http_threads;
    return l;
  }
};

Server::Server(ServerDeps deps) : impl_(std::make_unique<Impl>(deps)) {
  auto observe = [](const std::string& method, const std::string& route, int status, double seconds) {
    Metrics::Get().Request(method, route, status, seconds);
  };
  impl_->api_http = std::make_unique<http::Server>(impl_->ApiLimits(), impl_->ApiRoutes(), &Impl::TransportProblem, observe);
  if (!deps.config->metrics_listen.empty()) {
    http::Limits ml = impl_->ApiLimits();
    ml.worker_threads = 1;
    ml.max_connections = 64;
    std::vector<http::Route> mr = {{"GET", "/metrics", "/metrics", http::BodyPolicy::kNone,
                                    [](const http::Request&, http::Response& res) {
                                      res.content_type = "text/plain; version=0.0.4";
                                      res.body = Metrics::Get().Serialize();
                                    }}};
    impl_->metrics_http = std::make_unique<http::Server>(ml, std::move(mr), &Impl::TransportProblem,
                                                         [](const std::string&, const std::string&, int, double) {});
  }
}

Server::~Server() {
  Stop();
  if (impl_->metrics_thread.joinable()) impl_->metrics_thread.join();
}

Status Server::Listen(const std::string& host, int port) {
  OML_RETURN_IF_ERROR(impl_->api_http->Bind(host, port));
  if (impl_->metrics_http) {
    const std::string& m = impl_->d.config->metrics_listen;
    OML_RETURN_IF_ERROR(impl_->metrics_http->Bind(Config::HostOf(m), Config::PortOf(m)));
    log::Info("metrics listening", {{"address", m}});
    impl_->metrics_thread = std::thread([this] { (void)impl_->metrics_http->Run(); });
  }
  log::Info("listening", {{"address", host + ":" + std::to_string(port)}});
  return impl_->api_http->Run();
}

void Server::Stop() {
  impl_->api_http->Stop();
  if (impl_->metrics_http) impl_->metrics_http->Stop();
}

}  // namespace oml::api
