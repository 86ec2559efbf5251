// GET /v1/claims/{id}/attachments/{n}: one attachment of a claim, decrypted (admission/
// attachments.h), with single byte ranges (RFC 9110 §14). Helpers of server.cc's handler.
//
//   200  the whole attachment, of any size, streamed (constant memory per response: read from the
//        object store and decrypted piece by piece as the client reads); Repr-Digest:
//        sha-256=:<base64>: (RFC 9530) of its plaintext, from the journal; Accept-Ranges: bytes.
//        Each segment is authenticated before it is sent and the digest checked at the end: a
//        failure cuts the response short of its Content-Length
//   206  Range: bytes=a-b | a- | -n (one range): Content-Range: bytes a-b/size; every AES-GCM
//        segment the range touches is authenticated, the whole-file digest is not re-checked
//   416  a range past the end, or a malformed byte range; always Content-Range: bytes */size. A
//        range unit other than bytes is ignored and several ranges get the whole file (200).
//   HEAD the header of the GET's answer; nothing is read or journalled (Attachments::Describe)
// Content-Type is the media type declared at upload; Content-Disposition names the upload's
// filename (attachment; filename*=UTF-8''...).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "admission/attachments.h"
#include "api/http.h"
#include "common/status.h"

namespace oml::api {

// The Range header of a request: nullopt without one; kInvalidArgument "range-not-satisfiable"
// for a value that is not one byte range.
Result<std::optional<admission::ByteRange>> ParseRange(const http::Request& req);

// Fills a 200/206 response for a served attachment.
void AttachmentResponse(const admission::ServedAttachment& s, http::Response& res);

// An attachment as the claim document lists it (no bytes).
nlohmann::json AttachmentJson(const admission::Attachment& a);

}  // namespace oml::api
