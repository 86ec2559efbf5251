#include "api/uploads_handlers.h"

#include <cctype>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include "db/conn.h"
#include "uploads/tus.h"

namespace oml::api {
namespace {

namespace tus = uploads::tus;

class UploadsApi {
 public:
  UploadsApi(uploads::Uploads* u, UploadHooks h) : up_(u), h_(std::move(h)) {}

  // OPTIONS /v1/uploads: what this server speaks. No token: it reveals configuration only.
  void Options(const http::Request&, http::Response& res) {
    res.status = 204;
    res.SetHeader("Tus-Resumable", tus::kVersion);
    res.SetHeader("Tus-Version", tus::kVersion);
    res.SetHeader("Tus-Extension", tus::kExtensions);
    res.SetHeader("Tus-Max-Size", std::to_string(up_->options().max_length));
    res.SetHeader("Tus-Checksum-Algorithm", tus::kChecksumAlgorithms);
  }

  // POST /v1/uploads (creation).
  void Create(const http::Request& req, http::Response& res) {
    if (!Start(req, res)) return;
    auto caller = h_.authenticate(req);
    if (!caller.ok()) return Fail(req, res, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);  // one tenant never holds every connection
    if (req.HeaderCount("Upload-Defer-Length") > 0)
      return Fail(req, res, InvalidArgument("Upload-Defer-Length is not supported: declare Upload-Length", "invalid-upload-length"));
    auto length = OneHeader(req, "Upload-Length");
    if (!length.ok()) return Fail(req, res, InvalidArgument("Upload-Length is required, once", "invalid-upload-length"));
    auto n = tus::ParseUint(*length);
    if (!n) return Fail(req, res, InvalidArgument("Upload-Length must be a non-negative integer", "invalid-upload-length"));
    if (req.HeaderCount("Upload-Metadata") > 1)
      return Fail(req, res, InvalidArgument("Upload-Metadata must be sent once", "invalid-upload-metadata"));
    auto md = tus::ParseMetadata(req.Header("Upload-Metadata").value_or(""));
    if (!md.ok()) return Fail(req, res, md.status());
    auto nu = tus::ParseCreation(*n, *md);
    if (!nu.ok()) return Fail(req, res, nu.status());
    // Kept as sent (HEAD echoes it); ParseCreation required sha256, so it is never empty here.
    nu->metadata = req.Header("Upload-Metadata").value_or("");
    if (nu->metadata.size() > uploads::kMaxMetadataBytes)
      return Fail(req, res,
                  InvalidArgument("Upload-Metadata exceeds " + std::to_string(uploads::kMaxMetadataBytes) + " bytes",
                                  "invalid-upload-metadata"));
    if (Status g = h_.write_gate(*caller); !g.ok()) return Fail(req, res, g);
    auto s = up_->Create(OwnerOf(*caller), caller->role, *nu);
    h_.forget_if_revoked(*caller, s.status());
    if (!s.ok()) return Fail(req, res, s.status());
    res.status = 201;
    res.SetHeader("Location", "/v1/uploads/" + s->upload_id);
    res.SetHeader("Upload-Offset", std::to_string(s->offset));
    // Active or complete, a session can expire (a complete one unless a claim attaches it).
    res.SetHeader("Upload-Expires", tus::HttpDate(s->expires_at));
  }

  // HEAD /v1/uploads/{id}.
  void Head(const http::Request& req, http::Response& res) {
    if (!Start(req, res)) return;
    res.SetHeader("Cache-Control", "no-store");
    auto caller = h_.authenticate(req);
    if (!caller.ok()) return Fail(req, res, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);
    auto s = up_->Head(OwnerOf(*caller), req.captures[0]);
    if (!s.ok()) return Fail(req, res, s.status());
    res.status = 200;
    res.SetHeader("Upload-Offset", std::to_string(s->offset));
    res.SetHeader("Upload-Length", std::to_string(s->length));
    res.SetHeader("Upload-Expires", tus::HttpDate(s->expires_at));
    if (!s->metadata.empty()) {
      res.SetHeader("Upload-Metadata", s->metadata);  // as the client sent it (tus creation)
    } else {  // a session created before sql/0021: the parsed keys, re-encoded
      std::map<std::string, std::string> md = {{"sha256", s->declared_sha256}, {"content-type", s->media_type}};
      if (!s->filename.empty()) md["filename"] = s->filename;
      res.SetHeader("Upload-Metadata", tus::EncodeMetadata(md));
    }
  }

  // PATCH /v1/uploads/{id}.
  void Patch(const http::Request& req, http::Response& res) {
    if (!Start(req, res)) return;
    auto caller = h_.authenticate(req);
    if (!caller.ok()) return Fail(req, res, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);
    auto ct = OneHeader(req, "Content-Type");
    if (!ct.ok() || !IsOffsetOctetStream(*ct))
      return Fail(req, res,
                  InvalidArgument(std::string("a PATCH must have Content-Type: ") + tus::kOffsetContentType, "unsupported-media-type"));
    auto off_h = OneHeader(req, "Upload-Offset");
    if (!off_h.ok()) return Fail(req, res, InvalidArgument("Upload-Offset is required", "invalid-upload-offset"));
    auto offset = tus::ParseUint(*off_h);
    if (!offset) return Fail(req, res, InvalidArgument("Upload-Offset must be a non-negative integer", "invalid-upload-offset"));
    std::optional<uploads::Checksum> checksum;
    if (req.HeaderCount("Upload-Checksum") > 0) {
      auto v = OneHeader(req, "Upload-Checksum");
      if (!v.ok()) return Fail(req, res, InvalidArgument("Upload-Checksum must be sent once", "invalid-upload-checksum"));
      auto c = tus::ParseChecksum(*v);
      if (!c.ok()) return Fail(req, res, c.status());
      checksum = std::move(c).value();
    }
    if (Status g = h_.write_gate(*caller); !g.ok()) return Fail(req, res, g);
    std::optional<uint64_t> current;
    uint64_t seen = 0;
    auto s = up_->Append(OwnerOf(*caller), req.captures[0], *offset, req.body, checksum, &seen);
    h_.forget_if_revoked(*caller, s.status());
    if (!s.ok()) {
      // A 409 names the offset the client must resume from (the committed one; Append sets it
      // for every 409 it answers).
      if (s.status().code() == Code::kFailedPrecondition) current = seen;
      if (current) res.SetHeader("Upload-Offset", std::to_string(*current));
      return Fail(req, res, s.status());
    }
    res.status = 204;
    res.SetHeader("Upload-Offset", std::to_string(s->offset));
    res.SetHeader("Upload-Expires", tus::HttpDate(s->expires_at));
  }

  // DELETE /v1/uploads/{id} (termination) of an active or complete session: its DEK is shredded,
  // its parts and object deleted (uploads::Uploads::Cancel). Not behind the write gates: removing
  // data is always allowed. A 409 upload-busy carries no Upload-Offset (DELETE has none to resume).
  void Delete(const http::Request& req, http::Response& res) {
    if (!Start(req, res)) return;
    auto caller = h_.authenticate(req);
    if (!caller.ok()) return Fail(req, res, caller.status());
    db::Pool::ScopedShare share(caller->tenant_id);
    Status s = up_->Cancel(OwnerOf(*caller), req.captures[0]);
    if (!s.ok()) return Fail(req, res, s);
    res.status = 204;
  }

 private:
  static uploads::Owner OwnerOf(const admission::Caller& c) {
    return {c.tenant_id, c.api_key_id, c.api_key_hash, c.principal};
  }

  // Tus-Resumable on the response, and the request's must be 1.0.0 (412 with Tus-Version).
  bool Start(const http::Request& req, http::Response& res) {
    res.SetHeader("Tus-Resumable", tus::kVersion);
    auto v = req.Header("Tus-Resumable");
    if (req.HeaderCount("Tus-Resumable") == 1 && v && Trim(*v) == tus::kVersion) return true;
    res.SetHeader("Tus-Version", tus::kVersion);
    Fail(req, res,
         InvalidArgument(std::string("this server speaks tus ") + tus::kVersion + ": send Tus-Resumable: " + tus::kVersion,
                         "tus-version-unsupported"));
    return false;
  }

  void Fail(const http::Request& req, http::Response& res, const Status& s) { h_.problem(res, req, s); }

  static std::string Trim(std::string_view v) {
    const size_t b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
    return b == std::string_view::npos ? std::string() : std::string(v.substr(b, e - b + 1));
  }

  // The value of a header sent exactly once (trimmed); kInvalidArgument otherwise.
  static Result<std::string> OneHeader(const http::Request& req, const char* name) {
    if (req.HeaderCount(name) != 1) return InvalidArgument(std::string(name) + " must be sent once", "invalid-request");
    return Trim(*req.Header(name));
  }

  // application/offset+octet-stream, case-insensitive, parameters allowed.
  static bool IsOffsetOctetStream(const std::string& v) {
    std::string t = Trim(std::string_view(v).substr(0, v.find(';')));
    for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return t == tus::kOffsetContentType;
  }

  uploads::Uploads* up_;
  UploadHooks h_;
};

}  // namespace

std::vector<http::Route> UploadRoutes(uploads::Uploads* uploads, UploadHooks hooks) {
  auto api = std::make_shared<UploadsApi>(uploads, std::move(hooks));
  auto bind = [api](void (UploadsApi::*fn)(const http::Request&, http::Response&)) {
    return [api, fn](const http::Request& req, http::Response& res) { ((*api).*fn)(req, res); };
  };
  using BP = http::BodyPolicy;
  // The id is a UUID or anything else without '/' (answered 404 upload-not-found). tus core: a
  // POST with X-HTTP-Method-Override reaches HEAD, PATCH and DELETE of a session (a HEAD's
  // answer then carries its body, if any: the transport frames for the POST on the wire).
  constexpr bool kOverride = true;
  return {
      {"OPTIONS", "/v1/uploads", "/v1/uploads", BP::kNone, bind(&UploadsApi::Options)},
      {"POST", "/v1/uploads", "/v1/uploads", BP::kNone, bind(&UploadsApi::Create)},
      {"HEAD", "/v1/uploads/([^/]+)", "/v1/uploads/{id}", BP::kNone, bind(&UploadsApi::Head), kOverride},
      {"PATCH", "/v1/uploads/([^/]+)", "/v1/uploads/{id}", BP::kOptional, bind(&UploadsApi::Patch), kOverride},
      {"DELETE", "/v1/uploads/([^/]+)", "/v1/uploads/{id}", BP::kNone, bind(&UploadsApi::Delete), kOverride},
  };
}

}  // namespace oml::api
