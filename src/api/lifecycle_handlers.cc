#include "api/lifecycle_handlers.h"

#include <memory>
#include <optional>

#include "db/conn.h"

namespace oml::api {
namespace {

using nlohmann::json;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A path segment, percent-decoded (RFC 3986 §2.1; '+' stays '+'). A '%' not followed by two hex
// digits is kept as is; the id rules (fields.h) then decide.
std::string SegmentDecode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexDigit(s[i + 1]) >= 0 && HexDigit(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexDigit(s[i + 1]) * 16 + HexDigit(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// A path segment, percent-encoded: everything but RFC 3986 unreserved characters.
std::string SegmentEncode(const std::string& s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
        c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// A string member: present (or absent when not required) and a JSON string (server.cc StringField).
Result<std::string> StringField(const json& j, const char* name, bool required) {
  if (!j.contains(name) || j[name].is_null()) {
    if (required) return InvalidArgument(std::string("missing field '") + name + "'", "missing-field");
    return std::string();
  }
  if (!j[name].is_string()) return InvalidArgument(std::string("field '") + name + "' must be a string", "invalid-field");
  return j[name].get<std::string>();
}

void Json(http::Response& res, int status, const json& body) {
  res.status = status;
  res.content_type = "application/json";
  res.body = body.dump();
}

class LifecycleApi {
 public:
  LifecycleApi(admission::Lifecycle* lc, LifecycleHooks h) : lc_(lc), h_(std::move(h)) {}

  // POST /v1/claims/{id}/reassign
  void Reassign(const http::Request& req, http::Response& res) {
    auto caller = Begin(req, res);
    if (!caller) return;
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    if (Status g = h_.write_gate(*caller); !g.ok()) return h_.problem(res, req, g);
    auto j = h_.parse_object(req, {"workarea_id", "reason"});
    if (!j.ok()) return h_.problem(res, req, j.status());
    auto wa = StringField(*j, "workarea_id", true);
    if (!wa.ok()) return h_.problem(res, req, wa.status());
    auto reason = StringField(*j, "reason", false);
    if (!reason.ok()) return h_.problem(res, req, reason.status());
    auto out = lc_->Reassign(*caller, req.captures[0], *wa, *reason);
    h_.forget_if_revoked(*caller, out.status());
    if (!out.ok()) return h_.problem(res, req, out.status());
    json doc = h_.meta_json(out->first);
    doc["receipt"] = out->second.ToJson();
    Json(res, 200, doc);
  }

  // POST /v1/simulations
  void Start(const http::Request& req, http::Response& res) {
    auto caller = Begin(req, res);
    if (!caller) return;
    db::Pool::ScopedShare share(caller->tenant_id);
    if (Status g = h_.write_gate(*caller); !g.ok()) return h_.problem(res, req, g);
    auto j = h_.parse_object(req, {"simulation_id", "description"});
    if (!j.ok()) return h_.problem(res, req, j.status());
    auto id = StringField(*j, "simulation_id", true);
    if (!id.ok()) return h_.problem(res, req, id.status());
    auto desc = StringField(*j, "description", false);
    if (!desc.ok()) return h_.problem(res, req, desc.status());
    auto out = lc_->StartSimulation(*caller, *id, *desc);
    h_.forget_if_revoked(*caller, out.status());
    if (!out.ok()) return h_.problem(res, req, out.status());
    json doc = SimulationJson(out->first);
    doc["receipt"] = out->second.ToJson();
    res.SetHeader("Location", "/v1/simulations/" + SegmentEncode(out->first.simulation_id));
    Json(res, 201, doc);
  }

  // GET /v1/simulations/{sim}
  void Get(const http::Request& req, http::Response& res) {
    auto caller = Begin(req, res);
    if (!caller) return;
    db::Pool::ScopedShare share(caller->tenant_id);
    auto out = lc_->GetSimulation(*caller, SegmentDecode(req.captures[0]));
    if (!out.ok()) return h_.problem(res, req, out.status());
    Json(res, 200, SimulationJson(*out));
  }

  // POST /v1/simulations/{sim}/end
  void End(const http::Request& req, http::Response& res) {
    auto caller = Begin(req, res);
    if (!caller) return;
    db::Pool::ScopedShare share(caller->tenant_id);
    if (Status g = h_.write_gate(*caller); !g.ok()) return h_.problem(res, req, g);
    std::string reason;
    if (!req.body.empty()) {
      auto j = h_.parse_object(req, {"reason"});
      if (!j.ok()) return h_.problem(res, req, j.status());
      auto r = StringField(*j, "reason", false);
      if (!r.ok()) return h_.problem(res, req, r.status());
      reason = *r;
    }
    auto out = lc_->EndSimulation(*caller, SegmentDecode(req.captures[0]), reason);
    h_.forget_if_revoked(*caller, out.status());
    if (!out.ok()) return h_.problem(res, req, out.status());
    json doc = SimulationJson(out->first);
    doc["retracted"] = out->first.retracted ? json(*out->first.retracted) : json(nullptr);
    doc["receipt"] = out->second.ToJson();
    Json(res, 200, doc);
  }

 private:
  // The authenticated caller, or nullopt with the problem answered.
  std::optional<admission::Caller> Begin(const http::Request& req, http::Response& res) {
    auto caller = h_.authenticate(req);
    if (!caller.ok()) {
      h_.problem(res, req, caller.status());
      return std::nullopt;
    }
    return *caller;
  }

  admission::Lifecycle* lc_;
  LifecycleHooks h_;
};

}  // namespace

json SimulationJson(const admission::Simulation& s) {
  return {{"simulation_id", s.simulation_id},
          {"description", s.description},
          {"state", s.state},
          {"started_seq", s.started_seq},
          {"ended_seq", s.ended_seq ? json(*s.ended_seq) : json(nullptr)}};
}

std::vector<http::Route> LifecycleRoutes(admission::Lifecycle* lifecycle, LifecycleHooks hooks) {
  auto api = std::make_shared<LifecycleApi>(lifecycle, std::move(hooks));
  auto bind = [api](void (LifecycleApi::*fn)(const http::Request&, http::Response&)) {
    return [api, fn](const http::Request& req, http::Response& res) { ((*api).*fn)(req, res); };
  };
  using BP = http::BodyPolicy;
  return {
      {"POST", "/v1/claims/([^/]+)/reassign", "/v1/claims/{id}/reassign", BP::kRequired, bind(&LifecycleApi::Reassign)},
      {"POST", "/v1/simulations", "/v1/simulations", BP::kRequired, bind(&LifecycleApi::Start)},
      {"GET", "/v1/simulations/([^/]+)", "/v1/simulations/{sim}", BP::kNone, bind(&LifecycleApi::Get)},
      {"POST", "/v1/simulations/([^/]+)/end", "/v1/simulations/{sim}/end", BP::kOptional, bind(&LifecycleApi::End)},
  };
}

}  // namespace oml::api
