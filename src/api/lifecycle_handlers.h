// The later acts of the admission lifecycle over HTTP (admission/lifecycle.h):
//
//   POST /v1/claims/{id}/reassign   {"workarea_id", "reason"?}   200 claim document + receipt
//   POST /v1/simulations            {"simulation_id", "description"?}
//                                   201 simulation document + receipt; Location
//   GET  /v1/simulations/{sim}      200 simulation document
//   POST /v1/simulations/{sim}/end  {"reason"?} (body optional)  200 simulation document
//                                   (with "retracted") + receipt
//
// {sim} is the simulation id percent-encoded as a path segment (RFC 3986): "%2F" for "/", and
// so on; '+' is itself. The simulation document is {"simulation_id", "description", "state"
// (running | ended), "started_seq", "ended_seq" (null while running)}.
//
// Checks of a write, in order: authentication (401), the write gates (chain fork, durability:
// 503), the body (400 malformed-json, json-too-deep, unknown-field, missing-field,
// invalid-field), then Lifecycle's (lifecycle.h). These routes do not take an Idempotency-Key:
// each act is refused when repeated (409 workarea-unchanged, simulation-exists,
// simulation-not-running), which a client retrying after a lost answer reads as done.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/lifecycle.h"
#include "api/http.h"
#include "common/status.h"

namespace oml::api {

// What the handlers borrow from the API server (api/server.cc).
struct LifecycleHooks {
  std::function<Result<admission::Caller>(const http::Request&)> authenticate;
  // The write gates (chain fork, durability) of a write by this caller.
  std::function<Status(const admission::Caller&)> write_gate;
  // Fills res as the problem document of s (status by HttpStatus).
  std::function<void(http::Response&, const http::Request&, const Status&)> problem;
  // After a write refused with 401: forget the cached key.
  std::function<void(const admission::Caller&, const Status&)> forget_if_revoked;
  // The body as a JSON object with only `allowed` members (server.cc ParseObject).
  std::function<Result<nlohmann::json>(const http::Request&, const std::set<std::string>&)> parse_object;
  // The claim document of GET /v1/claims/{id}, without body.
  std::function<nlohmann::json(const admission::ClaimMeta&)> meta_json;
};

// The simulation document.
nlohmann::json SimulationJson(const admission::Simulation& s);

// The routes above. REQUIRES: lifecycle outlives the routes.
std::vector<http::Route> LifecycleRoutes(admission::Lifecycle* lifecycle, LifecycleHooks hooks);

}  // namespace oml::api
