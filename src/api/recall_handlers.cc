#include "api/recall_handlers.h"

#include <cstdio>

#include <map>
#include <set>

#include "admission/recall.h"

namespace oml::api {
namespace {

using nlohmann::json;

Status BadParam(const std::string& m) { return InvalidArgument(m, "invalid-parameter"); }

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The percent-decoded name of each parameter of the query string, in order (empty parts skipped),
// decoded as http::Request::Param decodes them.
std::vector<std::string> ParamNames(std::string_view q) {
  std::vector<std::string> names;
  while (!q.empty()) {
    const size_t amp = q.find('&');
    const std::string_view part = q.substr(0, amp);
    const std::string_view raw = part.substr(0, part.find('='));
    std::string name;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '+') {
        name.push_back(' ');
      } else if (raw[i] == '%' && i + 2 < raw.size() && Hex(raw[i + 1]) >= 0 && Hex(raw[i + 2]) >= 0) {
        name.push_back(static_cast<char>(Hex(raw[i + 1]) * 16 + Hex(raw[i + 2])));
        i += 2;
      } else {
        name.push_back(raw[i]);
      }
    }
    if (!part.empty()) names.push_back(std::move(name));
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
  return names;
}

// Refuses a parameter not in `allowed` and one given more than once.
Status CheckParams(const http::Request& req, const std::set<std::string>& allowed) {
  std::set<std::string> seen;
  for (const std::string& n : ParamNames(req.query)) {
    // Shown in the problem detail, which must stay valid UTF-8 JSON whatever the name's bytes:
    // every byte outside printable ASCII is %XX, and at most 64 bytes of it.
    std::string shown;
    for (unsigned char ch : n) {
      if (shown.size() >= 64) {
        shown += "...";
        break;
      }
      if (ch > 0x20 && ch < 0x7f && ch != '%') {
        shown += static_cast<char>(ch);
      } else {
        char esc[4];
        std::snprintf(esc, sizeof esc, "%%%02X", ch);
        shown += esc;
      }
    }
    if (!allowed.count(n)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return BadParam("unknown query parameter '" + shown + "' (this endpoint takes " + list + ")");
    }
    if (!seen.insert(n).second) return BadParam("query parameter '" + shown + "' is given more than once");
  }
  return Status::Ok();
}

Result<int> Limit(const http::Request& req) {
  auto p = req.Param("limit");
  if (!p) return admission::kRecallDefaultLimit;
  const std::string bad = "query parameter 'limit' must be an integer in [1, " +
                          std::to_string(admission::kRecallMaxLimit) + "]";
  if (p->empty() || p->size() > 9 || p->find_first_not_of("0123456789") != std::string::npos) return BadParam(bad);
  const int v = std::stoi(*p);
  if (v < 1 || v > admission::kRecallMaxLimit) return BadParam(bad);
  return v;
}

json PageJson(const admission::RecallPage& page, const MetaJsonFn& meta_json, bool search) {
  json claims = json::array();
  for (const admission::RecalledClaim& c : page.claims) {
    json j = meta_json(c.meta);
    j["submitted_at"] = c.submitted_at.empty() ? json(nullptr) : json(c.submitted_at);
    if (search) j["rank"] = c.rank;
    claims.push_back(std::move(j));
  }
  return {{"claims", std::move(claims)}, {"next_cursor", page.next_cursor ? json(*page.next_cursor) : json(nullptr)}};
}

}  // namespace

Result<json> RecallClaimsJson(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const admission::Caller& caller,
                              const http::Request& req, const MetaJsonFn& meta_json) {
  OML_RETURN_IF_ERROR(CheckParams(req, {"workarea_id", "state", "provenance", "simulation_id", "submitted_after",
                                        "submitted_before", "limit", "cursor"}));
  OML_ASSIGN_OR_RETURN(int limit, Limit(req));
  admission::ClaimFilter f;
  f.workarea_id = req.Param("workarea_id");
  f.state = req.Param("state");
  f.provenance = req.Param("provenance");
  f.simulation_id = req.Param("simulation_id");
  f.submitted_after = req.Param("submitted_after");
  f.submitted_before = req.Param("submitted_before");
  OML_ASSIGN_OR_RETURN(admission::RecallPage page,
                       admission::ListClaims(pool, cursor_keys, caller, f, limit, req.Param("cursor").value_or("")));
  return PageJson(page, meta_json, false);
}

Result<json> SearchClaimsJson(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const admission::Caller& caller,
                              const http::Request& req, const MetaJsonFn& meta_json) {
  OML_RETURN_IF_ERROR(CheckParams(req, {"q", "limit", "cursor"}));
  OML_ASSIGN_OR_RETURN(int limit, Limit(req));
  auto q = req.Param("q");
  if (!q) return BadParam("query parameter 'q' (the search text) is required");
  OML_ASSIGN_OR_RETURN(admission::RecallPage page,
                       admission::SearchClaims(pool, cursor_keys, caller, *q, limit, req.Param("cursor").value_or("")));
  return PageJson(page, meta_json, true);
}

}  // namespace oml::api
