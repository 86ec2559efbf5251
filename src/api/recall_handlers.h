// GET /v1/claims (recall) and GET /v1/search (full-text search over promoted text): the query
// parameters of a request, translated to admission/recall.h, and the page it answers as JSON.
// Who sees what, the order, the cursor and the text search configuration are recall.h's.
//
// Query parameters are matched by their percent-decoded names. A parameter the endpoint does not
// take, or one given twice, is 400 invalid-parameter: a mistyped filter must not widen a list.
//
//   GET /v1/claims   workarea_id, state, provenance, simulation_id, submitted_after,
//                    submitted_before, limit (1..500, default 50), cursor
//   GET /v1/search   q (required), limit, cursor
//
// 200 body: {"claims": [<claim>...], "next_cursor": "<cursor>" | null}, where <claim> is the
// claim document of GET /v1/claims/{id} without "body" and "attachments", plus "submitted_at"
// (the signed time of claim.submitted) and, in a search, "rank".
#pragma once

#include <functional>

#include <nlohmann/json.hpp>

#include "admission/claims.h"
#include "api/http.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"

namespace oml::api {

// The claim document of the API (server.cc, without a body).
using MetaJsonFn = std::function<nlohmann::json(const admission::ClaimMeta&)>;

// The 200 body of GET /v1/claims for `caller`, or the refusal (invalid-parameter, invalid-cursor,
// the database's).
// `cursor_keys`: the cursor secret (admission/cursor.h).
Result<nlohmann::json> RecallClaimsJson(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys,
                                        const admission::Caller& caller, const http::Request& req,
                                        const MetaJsonFn& meta_json);
// The 200 body of GET /v1/search, or the refusal (as above; a missing q is invalid-parameter).
Result<nlohmann::json> SearchClaimsJson(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys,
                                        const admission::Caller& caller, const http::Request& req,
                                        const MetaJsonFn& meta_json);

}  // namespace oml::api
