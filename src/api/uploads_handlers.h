// tus 1.0 (core, creation, expiration, termination, checksum) under /v1/uploads: the transport
// side of uploads::Uploads. docs/api/openapi.yaml ("uploads") states the protocol as served.
//
//   OPTIONS /v1/uploads          204; Tus-Version, Tus-Extension, Tus-Max-Size,
//                                Tus-Checksum-Algorithm. No token needed.
//   POST    /v1/uploads          creation: Upload-Length, Upload-Metadata (sha256 required);
//                                201 Location: /v1/uploads/{id}, Upload-Expires
//   HEAD    /v1/uploads/{id}     200 Upload-Offset, Upload-Length, Upload-Expires, Upload-Metadata,
//                                Cache-Control: no-store
//   PATCH   /v1/uploads/{id}     Content-Type: application/offset+octet-stream, Upload-Offset,
//                                optional Upload-Checksum; 204 Upload-Offset (+ Upload-Expires)
//   DELETE  /v1/uploads/{id}     termination: 204
//
// Every request but OPTIONS must carry Tus-Resumable: 1.0.0 (else 412 with Tus-Version, before
// authentication); every response, problems included, carries Tus-Resumable: 1.0.0. Checks of
// a PATCH, in order: Tus-Resumable (412), authentication (401), Content-Type (415), Upload-Offset
// present and numeric (400), Upload-Checksum well-formed (400), the durability gate (503), then
// uploads::Uploads::Append's (404, 410, 409, 413, 460, 422). A 409 carries the session's offset
// in Upload-Offset when it is known.
#pragma once

#include <functional>
#include <vector>

#include "admission/claims.h"
#include "api/http.h"
#include "common/status.h"
#include "uploads/uploads.h"

namespace oml::api {

// What the handlers borrow from the API server (api/server.cc).
struct UploadHooks {
  std::function<Result<admission::Caller>(const http::Request&)> authenticate;
  // The write gates (chain fork, durability) of a write by this caller.
  std::function<Status(const admission::Caller&)> write_gate;
  // Fills res as the problem document of s (status by HttpStatus).
  std::function<void(http::Response&, const http::Request&, const Status&)> problem;
  // After a write refused with 401: forget the cached key.
  std::function<void(const admission::Caller&, const Status&)> forget_if_revoked;
};

// The routes above. REQUIRES: uploads outlives the routes.
std::vector<http::Route> UploadRoutes(uploads::Uploads* uploads, UploadHooks hooks);

}  // namespace oml::api
