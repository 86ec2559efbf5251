#include "uploads/uploads.h"

#include <cstdio>
#include <openssl/evp.h>

#include <regex>

#include "common/log.h"
#include "common/sync_point.h"
#include "uploads/running_sha256.h"

namespace oml::uploads {
namespace {

constexpr int64_t kSweepBatch = 100;

bool ValidUuid(const std::string& s) {
  static const std::regex kUuid("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$");
  return std::regex_match(s, kUuid);
}

Status NotFoundUpload(const std::string& id) { return NotFound("no upload " + id.substr(0, 64), "upload-not-found"); }
Status Expired(const std::string& id) {
  return Status(Code::kGone, "upload " + id + " expired; its data was removed", "upload-expired");
}
Status Failed(const std::string& id) {
  return Status(Code::kGone, "upload " + id + " failed at its last byte; its data was removed", "upload-failed");
}
// The answer a session in a final state other than complete gives to every request: cancelled
// 404, failed or expired 410. OK for the other states.
Status EndedSessionRefusal(State state, const std::string& id) {
  switch (state) {
    case State::kCancelled: return NotFoundUpload(id);
    case State::kFailed: return Failed(id);
    case State::kExpired: return Expired(id);
    default: return Status::Ok();
  }
}

Result<State> ParseState(const std::string& s) {
  if (s == "created") return State::kCreated;
  if (s == "receiving") return State::kReceiving;
  if (s == "complete") return State::kComplete;
  if (s == "failed") return State::kFailed;
  if (s == "expired") return State::kExpired;
  if (s == "cancelled") return State::kCancelled;
  return DataLoss("upload session in unknown state '" + s + "'", "integrity");
}

bool Active(State s) { return s == State::kCreated || s == State::kReceiving; }

// Rolls back an open transaction on every early return.
struct TxnGuard {
  db::Conn& c;
  bool open = true;
  ~TxnGuard() {
    if (open) (void)c.Exec("ROLLBACK");
  }
  Status Commit() {
    open = false;
    OML_ASSIGN_OR_RETURN(db::Rows r, c.Query("COMMIT"));
    return c.CommitVerdict(r);
  }
};

std::string Digest(ChecksumAlgorithm a, std::string_view bytes) {
  if (a == ChecksumAlgorithm::kSha256) return crypto::Sha256(bytes);
  unsigned char md[20];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha1(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), n);
}

// Every column a session's handling reads, in this order (Row::Parse).
const char kColumns[] =
    "upload_id::text, state, upload_length, upload_offset, declared_sha256, coalesce(filename, ''), media_type, "
    "kek_id, wrapped_dek, segment_size, nonce_prefix, next_segment, header_sent, pending_sealed, plaintext_sha_sealed, "
    "ciphertext_sha_state, ciphertext_offset, part_count, extract(epoch from expires_at)::bigint, "
    "(expires_at <= now()), principal, api_key_id";

}  // namespace

struct Uploads::Row {
  std::string upload_id;
  State state = State::kCreated;
  uint64_t length = 0, offset = 0;
  std::string declared_sha256, filename, media_type;
  std::string kek_id, wrapped_dek;  // empty once final (not complete)
  uint32_t segment_size = 0;
  std::string nonce_prefix;
  uint64_t next_segment = 0;
  bool header_sent = false;
  std::optional<std::string> pending_sealed, plaintext_sha_sealed, ciphertext_sha_state;
  uint64_t ciphertext_offset = 0;
  int64_t part_count = 0;
  int64_t expires_at = 0;
  bool overdue = false;
  std::string principal, api_key_id;

  static Result<Row> Parse(const db::Rows& r, int i) {
    Row w;
    w.upload_id = r.Get(i, 0);
    OML_ASSIGN_OR_RETURN(w.state, ParseState(r.Get(i, 1)));
    w.length = static_cast<uint64_t>(r.GetInt(i, 2));
    w.offset = static_cast<uint64_t>(r.GetInt(i, 3));
    w.declared_sha256 = r.GetBytes(i, 4);
    w.filename = r.Get(i, 5);
    w.media_type = r.Get(i, 6);
    if (!r.IsNull(i, 7)) w.kek_id = r.Get(i, 7);
    if (!r.IsNull(i, 8)) w.wrapped_dek = r.GetBytes(i, 8);
    w.segment_size = static_cast<uint32_t>(r.GetInt(i, 9));
    w.nonce_prefix = r.GetBytes(i, 10);
    w.next_segment = static_cast<uint64_t>(r.GetInt(i, 11));
    w.header_sent = r.Get(i, 12) == "t";
    if (!r.IsNull(i, 13)) w.pending_sealed = r.GetBytes(i, 13);
    if (!r.IsNull(i, 14)) w.plaintext_sha_sealed = r.GetBytes(i, 14);
    if (!r.IsNull(i, 15)) w.ciphertext_sha_state = r.GetBytes(i, 15);
    w.ciphertext_offset = static_cast<uint64_t>(r.GetInt(i, 16));
    w.part_count = r.GetInt(i, 17);
    w.expires_at = r.GetInt(i, 18);
    w.overdue = r.Get(i, 19) == "t";
    w.principal = r.Get(i, 20);
    w.api_key_id = r.Get(i, 21);
    return w;
  }

  Session ToSession() const {
    Session s;
    s.upload_id = upload_id;
    s.state = state;
    s.length = length;
    s.offset = offset;
    s.expires_at = expires_at;
    s.declared_sha256 = declared_sha256;
    s.filename = filename;
    s.media_type = media_type;
    return s;
  }
};

const char* StateName(State s) {
  switch (s) {
    case State::kCreated: return "created";
    case State::kReceiving: return "receiving";
    case State::kComplete: return "complete";
    case State::kFailed: return "failed";
    case State::kExpired: return "expired";
    case State::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::string UploadDekAad(const std::string& tenant, const std::string& upload_id) {
  return "oml-upload-dek|" + tenant + "|" + upload_id;
}
std::string AttachmentAad(const std::string& tenant, const std::string& upload_id) {
  return "oml-attachment|" + tenant + "|" + upload_id;
}
std::string PendingAad(const std::string& tenant, const std::string& upload_id, uint64_t offset) {
  return "oml-upload-pending|" + tenant + "|" + upload_id + "|" + std::to_string(offset);
}
std::string ShaStateAad(const std::string& tenant, const std::string& upload_id, uint64_t offset) {
  return "oml-upload-sha|" + tenant + "|" + upload_id + "|" + std::to_string(offset);
}
std::string PartPrefix(const std::string& tenant, const std::string& upload_id) {
  return tenant + "/uploads/" + upload_id + "/";
}
std::string PartKey(const std::string& tenant, const std::string& upload_id, int64_t part_no) {
  char n[32];
  std::snprintf(n, sizeof n, "%08lld", static_cast<long long>(part_no));
  return PartPrefix(tenant, upload_id) + n;
}
std::string ObjectKey(const std::string& tenant, const std::string& ciphertext_sha256_raw) {
  return tenant + "/" + crypto::Hex(ciphertext_sha256_raw);
}

Uploads::Uploads(db::Pool* pool, const crypto::KekProvider* kek, blob::ObjectStore* quarantine, Options opts)
    : pool_(pool), kek_(kek), store_(quarantine), opts_(opts) {}

Result<Session> Uploads::Create(const Owner& o, const std::string& role, const NewUpload& req) {
  if (role == "reviewer") return PermissionDenied("role reviewer may not upload", "forbidden-role");
  if (req.length > opts_.max_length)
    return Status(Code::kPayloadTooLarge,
                  "Upload-Length " + std::to_string(req.length) + " exceeds the maximum of " +
                      std::to_string(opts_.max_length) + " bytes",
                  "upload-too-large");
  if (req.plaintext_sha256.size() != 32)
    return InvalidArgument("the declared sha256 must be 32 bytes", "invalid-upload-metadata");
  const std::string id = crypto::NewUuidV4();
  const std::string& t = o.tenant_id;
  const crypto::SecureBytes dek(crypto::RandomBytes(32));  // wiped on every return
  OML_ASSIGN_OR_RETURN(std::string wrapped, kek_->Wrap(dek.view(), UploadDekAad(t, id)));
  OML_ASSIGN_OR_RETURN(auto enc, crypto::AeadStreamEncryptor::Create(dek.view(), AttachmentAad(t, id), opts_.segment_size));
  OML_ASSIGN_OR_RETURN(crypto::AeadEncryptorState st, enc->Suspend());
  const RunningSha256 fresh;
  OML_ASSIGN_OR_RETURN(std::string sha_sealed, crypto::EncryptAll(dek.view(), ShaStateAad(t, id, 0), fresh.State()));

  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  TxnGuard txn{*c};
  std::vector<db::Stmt> stmts = {{"BEGIN", {}}, db::ScopeTo(t)};
  if (!o.api_key_hash.empty())
    stmts.push_back({"SELECT oml.require_live_api_key($1)", {db::Bytes(o.api_key_hash)}, "oml_require_live_key"});
  stmts.push_back(
      {"INSERT INTO oml.upload_sessions (tenant_id, upload_id, api_key_id, principal, upload_length, declared_sha256, "
       "filename, media_type, kek_id, wrapped_dek, segment_size, nonce_prefix, plaintext_sha_sealed, "
       "ciphertext_sha_state, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, "
       "now() + make_interval(secs => $15)) RETURNING extract(epoch from expires_at)::bigint",
       {db::Text(t), db::Text(id), db::Text(o.api_key_id), db::Text(o.principal), db::Int(static_cast<int64_t>(req.length)),
        db::Bytes(req.plaintext_sha256), req.filename.empty() ? db::Null() : db::Text(req.filename),
        db::Text(req.media_type), db::Text(kek_->kek_id()), db::Bytes(wrapped), db::Int(opts_.segment_size),
        db::Bytes(st.nonce_prefix), db::Bytes(sha_sealed), db::Bytes(RunningSha256().State()),
        db::Int(static_cast<int64_t>(opts_.expiry.count()))}});
  OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline(stmts));
  OML_RETURN_IF_ERROR(txn.Commit());
  Session s;
  s.upload_id = id;
  s.state = State::kCreated;
  s.length = req.length;
  s.expires_at = rs.back().GetInt(0, 0);
  s.declared_sha256 = req.plaintext_sha256;
  s.filename = req.filename;
  s.media_type = req.media_type;
  // Nothing to wait for: an empty file is complete (or failed) now.
  if (req.length == 0) return Append(o, id, 0, std::string_view(), std::nullopt);
  return s;
}

Result<Session> Uploads::Head(const Owner& o, const std::string& id) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  Row row;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(o.tenant_id, {std::string("SELECT ") + kColumns +
                                                                 " FROM oml.upload_sessions WHERE tenant_id = $1 "
                                                                 "AND upload_id = $2 AND api_key_id = $3",
                                                             {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}}));
    if (r.size() == 0) return NotFoundUpload(id);
    OML_ASSIGN_OR_RETURN(row, Row::Parse(r, 0));
  }
  OML_RETURN_IF_ERROR(EndedSessionRefusal(row.state, id));
  if (Active(row.state) && row.overdue) {
    // Expired on access: in its own transaction, unless a chunk holds the row (it finds the
    // session overdue itself, or the sweep does later).
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
    TxnGuard txn{*c};
    OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline({{"BEGIN", {}},
                                               db::ScopeTo(o.tenant_id),
                                               {"SELECT 1 FROM oml.upload_sessions WHERE tenant_id = $1 AND upload_id = $2 "
                                                "AND state IN ('created', 'receiving') FOR UPDATE SKIP LOCKED",
                                                {db::Text(o.tenant_id), db::Text(id)}}}));
    if (rs[2].size() == 1) {
      OML_RETURN_IF_ERROR(EndSession(*c, o, id, State::kExpired));
      OML_RETURN_IF_ERROR(txn.Commit());
      if (Status s = RemoveParts(o.tenant_id, id); !s.ok())
        log::Warn("upload parts not removed yet (the sweep retries)", {{"upload", id}, {"error", s.ToString()}});
    }
    return Expired(id);
  }
  return row.ToSession();
}

Result<Session> Uploads::Append(const Owner& o, const std::string& id, uint64_t offset, std::string_view bytes,
                                const std::optional<Checksum>& checksum, uint64_t* current) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  TxnGuard txn{*c};
  std::vector<db::Stmt> stmts = {{"BEGIN", {}}, db::ScopeTo(o.tenant_id)};
  if (!o.api_key_hash.empty())
    stmts.push_back({"SELECT oml.require_live_api_key($1)", {db::Bytes(o.api_key_hash)}, "oml_require_live_key"});
  stmts.push_back({std::string("SELECT ") + kColumns +
                       " FROM oml.upload_sessions WHERE tenant_id = $1 AND upload_id = $2 AND api_key_id = $3 "
                       "FOR UPDATE SKIP LOCKED",
                   {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}});
  OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline(stmts));
  const db::Rows& locked = rs.back();
  if (locked.size() == 0) {
    // Missing, or locked by another chunk (or a sweep / key rotation batch, briefly).
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Query("SELECT upload_offset, state FROM oml.upload_sessions "
                                              "WHERE tenant_id = $1 AND upload_id = $2 AND api_key_id = $3",
                                              {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}));
    if (r.size() == 0 || r.Get(0, 1) == "cancelled") return NotFoundUpload(id);
    if (current) *current = static_cast<uint64_t>(r.GetInt(0, 0));
    return FailedPrecondition("another request is appending to upload " + id + "; retry after HEAD", "upload-busy");
  }
  OML_ASSIGN_OR_RETURN(Row row, Row::Parse(locked, 0));
  if (current) *current = row.offset;
  OML_RETURN_IF_ERROR(EndedSessionRefusal(row.state, id));
  if (Active(row.state) && row.overdue) {
    OML_RETURN_IF_ERROR(EndSession(*c, o, id, State::kExpired));
    OML_RETURN_IF_ERROR(txn.Commit());
    if (Status s = RemoveParts(o.tenant_id, id); !s.ok())
      log::Warn("upload parts not removed yet (the sweep retries)", {{"upload", id}, {"error", s.ToString()}});
    return Expired(id);
  }
  if (offset != row.offset)
    return FailedPrecondition("Upload-Offset " + std::to_string(offset) + " is not the upload's offset " +
                                  std::to_string(row.offset),
                              "upload-offset-mismatch");
  if (bytes.size() > row.length - row.offset)
    return Status(Code::kPayloadTooLarge,
                  "the chunk of " + std::to_string(bytes.size()) + " bytes at offset " + std::to_string(offset) +
                      " goes past the declared Upload-Length " + std::to_string(row.length),
                  "upload-length-exceeded");
  if (row.state == State::kComplete) return row.ToSession();  // an empty chunk at the end: nothing to do
  if (checksum && !crypto::ConstantTimeEquals(Digest(checksum->algorithm, bytes), checksum->digest))
    return InvalidArgument("the chunk does not match its Upload-Checksum; it was discarded", "checksum-mismatch");
  return DoAppend(*c, o, row, offset, bytes, &txn.open);
}

// REQUIRES: the row is locked in c's open transaction, active, at `offset`, and the chunk fits.
// Commits (or leaves the transaction to the caller's guard on error).
Result<Session> Uploads::DoAppend(db::Conn& c, const Owner& o, Row& row, uint64_t offset, std::string_view bytes,
                                  bool* txn_open) {
  const std::string& t = o.tenant_id;
  const std::string& id = row.upload_id;
  const uint64_t new_offset = offset + bytes.size();
  const bool last = new_offset == row.length;
  if (bytes.empty() && !last) {
    *txn_open = false;
    OML_ASSIGN_OR_RETURN(db::Rows r, c.Query("COMMIT"));
    OML_RETURN_IF_ERROR(c.CommitVerdict(r));
    return row.ToSession();
  }
  if (row.wrapped_dek.empty() || !row.plaintext_sha_sealed || !row.ciphertext_sha_state)
    return DataLoss("upload " + id + " has no key or hash state", "integrity");
  auto dek = kek_->UnwrapFrom(row.kek_id, row.wrapped_dek, UploadDekAad(t, id));
  if (!dek.ok() && dek.status().type() == "kek-unavailable") return dek.status();
  if (!dek.ok()) return DataLoss("DEK of upload " + id + " does not unwrap", "integrity");

  // The stream and both hashes as the last commit left them.
  crypto::AeadEncryptorState st;
  st.segment_size = row.segment_size;
  st.nonce_prefix = row.nonce_prefix;
  st.next_segment = row.next_segment;
  st.header_sent = row.header_sent;
  if (row.pending_sealed) {
    auto p = crypto::DecryptAll(dek->view(), PendingAad(t, id, offset), *row.pending_sealed);
    if (!p.ok()) return DataLoss("pending bytes of upload " + id + " do not decrypt", "integrity");
    st.pending = crypto::SecureBytes(std::move(p).value());
  }
  auto sha_bytes = crypto::DecryptAll(dek->view(), ShaStateAad(t, id, offset), *row.plaintext_sha_sealed);
  if (!sha_bytes.ok()) return DataLoss("hash state of upload " + id + " does not decrypt", "integrity");
  auto pt_sha = RunningSha256::FromState(*sha_bytes);
  crypto::Wipe(&*sha_bytes);
  if (!pt_sha.ok()) return pt_sha.status();
  OML_ASSIGN_OR_RETURN(RunningSha256 ct_sha, RunningSha256::FromState(*row.ciphertext_sha_state));
  if (pt_sha->length() != offset) return DataLoss("hash state of upload " + id + " is not at its offset", "integrity");
  OML_ASSIGN_OR_RETURN(auto enc, crypto::AeadStreamEncryptor::Resume(dek->view(), AttachmentAad(t, id), std::move(st)));

  OML_ASSIGN_OR_RETURN(std::string ct, enc->Update(bytes));
  pt_sha->Update(bytes);

  if (last) {
    OML_ASSIGN_OR_RETURN(std::string tail, enc->Finish());
    ct += tail;
    if (!crypto::ConstantTimeEquals(pt_sha->Digest(), row.declared_sha256)) {
      // The whole file is not the declared one: the session fails and keeps nothing.
      OML_RETURN_IF_ERROR(EndSession(c, o, id, State::kFailed));
      *txn_open = false;
      OML_ASSIGN_OR_RETURN(db::Rows r, c.Query("COMMIT"));
      OML_RETURN_IF_ERROR(c.CommitVerdict(r));
      if (Status s = RemoveParts(t, id); !s.ok())
        log::Warn("upload parts not removed yet (the sweep retries)", {{"upload", id}, {"error", s.ToString()}});
      return InvalidArgument("the file's SHA-256 is not the declared sha256; the upload failed and its data was removed",
                             "digest-mismatch");
    }
    ct_sha.Update(ct);
    const std::string ct_digest = ct_sha.Digest();
    const uint64_t ct_size = row.ciphertext_offset + ct.size();
    const std::string key = ObjectKey(t, ct_digest);
    // Compose parts 1..part_count and the final bytes into the object, re-hashing what the
    // store returns: a part that is not what was put is kDataLoss, and no object appears.
    {
      OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.complete.before_object"));
      OML_ASSIGN_OR_RETURN(std::unique_ptr<blob::ObjectWriter> w, store_->OpenWriter(key));
      RunningSha256 check;
      auto fail = [&](Status s) {
        (void)w->Abort();
        return s;
      };
      for (int64_t p = 1; p <= row.part_count; ++p) {
        auto got = store_->Get(PartKey(t, id, p));
        if (!got.ok()) return fail(got.status());
        if (!got->has_value()) return fail(DataLoss("part " + std::to_string(p) + " of upload " + id + " is missing", "integrity"));
        check.Update(**got);
        if (Status s = w->Write(**got); !s.ok()) return fail(s);
      }
      check.Update(ct);
      if (Status s = w->Write(ct); !s.ok()) return fail(s);
      if (check.length() != ct_size || !crypto::ConstantTimeEquals(check.Digest(), ct_digest))
        return fail(DataLoss("the parts of upload " + id + " are not the ciphertext that was put", "integrity"));
      OML_RETURN_IF_ERROR(w->Finish());
    }
    OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.complete.after_object"));
    OML_ASSIGN_OR_RETURN(
        auto done,
        c.Pipeline({{"WITH u AS (UPDATE oml.upload_sessions SET state = 'complete', upload_offset = upload_length, "
                     "pending_sealed = NULL, plaintext_sha_sealed = NULL, ciphertext_sha_state = NULL, "
                     "next_segment = $3, header_sent = true, ciphertext_offset = $4, parts_left = true, "
                     "completed_at = now(), updated_at = now(), plaintext_sha256 = declared_sha256, "
                     "ciphertext_sha256 = $5, ciphertext_size = $4, object_key = $6 "
                     "WHERE tenant_id = $1 AND upload_id = $2 AND state IN ('created', 'receiving') RETURNING 1) "
                     "SELECT 1/count(*) FROM u",
                     {db::Text(t), db::Text(id), db::Int(static_cast<int64_t>(row.next_segment)),
                      db::Int(static_cast<int64_t>(ct_size)), db::Bytes(ct_digest), db::Text(key)}},
                    {"COMMIT", {}}}));
    *txn_open = false;
    OML_RETURN_IF_ERROR(c.CommitVerdict(done.back()));
    if (Status s = RemoveParts(t, id); !s.ok())
      log::Warn("upload parts not removed yet (the sweep retries)", {{"upload", id}, {"error", s.ToString()}});
    row.state = State::kComplete;
    row.offset = new_offset;
    return row.ToSession();
  }

  // Not the last byte: the whole segments go out as the next part, the tail stays sealed.
  ct_sha.Update(ct);
  int64_t parts = row.part_count;
  if (!ct.empty()) {
    ++parts;
    OML_RETURN_IF_ERROR(store_->Put(PartKey(t, id, parts), ct));
  }
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.append.after_part"));
  OML_ASSIGN_OR_RETURN(crypto::AeadEncryptorState next, enc->Suspend());
  db::Param pending = db::Null();
  if (!next.pending.empty()) {
    OML_ASSIGN_OR_RETURN(std::string sealed, crypto::EncryptAll(dek->view(), PendingAad(t, id, new_offset), next.pending.view()));
    pending = db::Bytes(std::move(sealed));
  }
  std::string sha_state = pt_sha->State();
  auto sha_sealed = crypto::EncryptAll(dek->view(), ShaStateAad(t, id, new_offset), sha_state);
  crypto::Wipe(&sha_state);
  dek->Wipe();
  if (!sha_sealed.ok()) return sha_sealed.status();
  OML_ASSIGN_OR_RETURN(
      auto done,
      c.Pipeline({{"WITH u AS (UPDATE oml.upload_sessions SET state = 'receiving', upload_offset = $3, next_segment = $4, "
                   "header_sent = $5, pending_sealed = $6, plaintext_sha_sealed = $7, ciphertext_sha_state = $8, "
                   "ciphertext_offset = $9, part_count = $10, parts_left = parts_left OR $10 > 0, updated_at = now() "
                   "WHERE tenant_id = $1 AND upload_id = $2 AND upload_offset = $11 AND state IN ('created', 'receiving') "
                   "RETURNING 1) SELECT 1/count(*) FROM u",
                   {db::Text(t), db::Text(id), db::Int(static_cast<int64_t>(new_offset)),
                    db::Int(static_cast<int64_t>(next.next_segment)), db::Text(next.header_sent ? "true" : "false"),
                    std::move(pending), db::Bytes(*sha_sealed), db::Bytes(ct_sha.State()),
                    db::Int(static_cast<int64_t>(row.ciphertext_offset + ct.size())), db::Int(parts),
                    db::Int(static_cast<int64_t>(offset))}},
                  {"COMMIT", {}}}));
  *txn_open = false;
  OML_RETURN_IF_ERROR(c.CommitVerdict(done.back()));
  row.state = State::kReceiving;
  row.offset = new_offset;
  return row.ToSession();
}

Status Uploads::Cancel(const Owner& o, const std::string& id) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  TxnGuard txn{*c};
  OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline({{"BEGIN", {}},
                                             db::ScopeTo(o.tenant_id),
                                             {std::string("SELECT ") + kColumns +
                                                  " FROM oml.upload_sessions WHERE tenant_id = $1 AND upload_id = $2 "
                                                  "AND api_key_id = $3 FOR UPDATE SKIP LOCKED",
                                              {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}}}));
  if (rs[2].size() == 0) {
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Query("SELECT state FROM oml.upload_sessions WHERE tenant_id = $1 AND "
                                              "upload_id = $2 AND api_key_id = $3",
                                              {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}));
    if (r.size() == 0 || r.Get(0, 0) == "cancelled") return NotFoundUpload(id);
    return FailedPrecondition("another request is appending to upload " + id + "; retry", "upload-busy");
  }
  OML_ASSIGN_OR_RETURN(Row row, Row::Parse(rs[2], 0));
  OML_RETURN_IF_ERROR(EndedSessionRefusal(row.state, id));
  if (row.state == State::kComplete)
    return FailedPrecondition("upload " + id + " is complete; it is no longer cancelled by DELETE", "upload-complete");
  const State to = row.overdue ? State::kExpired : State::kCancelled;
  OML_RETURN_IF_ERROR(EndSession(*c, o, id, to));
  OML_RETURN_IF_ERROR(txn.Commit());
  if (Status s = RemoveParts(o.tenant_id, id); !s.ok())
    log::Warn("upload parts not removed yet (the sweep retries)", {{"upload", id}, {"error", s.ToString()}});
  if (to == State::kExpired) return Expired(id);
  return Status::Ok();
}

Status Uploads::EndSession(db::Conn& c, const Owner& o, const std::string& id, State to) {
  // parts_left: a part put by a chunk whose commit never came is not counted in part_count, so
  // every final session has its prefix listed once (RemoveParts).
  return c
      .Query("WITH u AS (UPDATE oml.upload_sessions SET state = $3, kek_id = NULL, wrapped_dek = NULL, "
             "pending_sealed = NULL, plaintext_sha_sealed = NULL, ciphertext_sha_state = NULL, parts_left = true, "
             "updated_at = now() WHERE tenant_id = $1 AND upload_id = $2 AND state IN ('created', 'receiving') "
             "RETURNING 1) SELECT 1/count(*) FROM u",
             {db::Text(o.tenant_id), db::Text(id), db::Text(StateName(to))})
      .status();
}

Status Uploads::RemoveParts(const std::string& tenant, const std::string& id, int64_t* removed) {
  OML_ASSIGN_OR_RETURN(std::vector<std::string> keys, store_->List(PartPrefix(tenant, id)));
  for (const auto& k : keys) {
    OML_RETURN_IF_ERROR(store_->Delete(k));
    if (removed) ++*removed;
  }
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  return c
      ->Scoped(tenant, {"UPDATE oml.upload_sessions SET parts_left = false WHERE tenant_id = $1 AND upload_id = $2 "
                        "AND state NOT IN ('created', 'receiving')",
                        {db::Text(tenant), db::Text(id)}})
      .status();
}

Result<CompletedUpload> Uploads::LookupCompleted(const Owner& o, const std::string& id) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  TxnGuard txn{*c};
  OML_RETURN_IF_ERROR(c->Pipeline({{"BEGIN", {}}, db::ScopeTo(o.tenant_id)}).status());
  OML_ASSIGN_OR_RETURN(CompletedUpload u, LookupCompleted(*c, o, id, /*lock=*/false));
  OML_RETURN_IF_ERROR(txn.Commit());
  return u;
}

Result<CompletedUpload> Uploads::LookupCompleted(db::Conn& tx, const Owner& o, const std::string& id, bool lock) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      tx.Query(std::string("SELECT state, api_key_id, principal, upload_length, plaintext_sha256, ciphertext_sha256, "
                           "ciphertext_size, media_type, coalesce(filename, ''), object_key, wrapped_dek, kek_id, "
                           "extract(epoch from completed_at)::bigint FROM oml.upload_sessions "
                           "WHERE tenant_id = $1 AND upload_id = $2 AND api_key_id = $3") +
                   (lock ? " FOR SHARE" : ""),
               {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}));
  if (r.size() == 0 || r.Get(0, 0) == "cancelled") return NotFoundUpload(id);
  if (r.Get(0, 0) != "complete") return NotFound("upload " + id + " is " + r.Get(0, 0) + ", not complete", "upload-not-found");
  CompletedUpload u;
  u.upload_id = id;
  u.tenant_id = o.tenant_id;
  u.api_key_id = r.Get(0, 1);
  u.principal = r.Get(0, 2);
  u.size = static_cast<uint64_t>(r.GetInt(0, 3));
  u.plaintext_sha256 = r.GetBytes(0, 4);
  u.ciphertext_sha256 = r.GetBytes(0, 5);
  u.ciphertext_size = static_cast<uint64_t>(r.GetInt(0, 6));
  u.media_type = r.Get(0, 7);
  u.filename = r.Get(0, 8);
  u.object_key = r.Get(0, 9);
  u.wrapped_dek = r.GetBytes(0, 10);
  u.kek_id = r.Get(0, 11);
  u.completed_at = r.GetInt(0, 12);
  return u;
}

Result<SweepReport> Uploads::Sweep() {
  SweepReport rep;
  std::vector<std::string> tenants;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Query("SELECT t::text FROM oml.upload_sweep_tenants(make_interval(secs => $1)) t",
                                              {db::Int(static_cast<int64_t>(opts_.tombstone_retention.count()))}));
    for (int i = 0; i < r.size(); ++i) tenants.push_back(r.Get(i, 0));
  }
  for (const std::string& t : tenants) {
    const Owner sys{t, "", "", ""};
    // 1. Overdue active sessions, in batches; a session a chunk holds is skipped.
    for (;;) {
      OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
      TxnGuard txn{*c};
      OML_ASSIGN_OR_RETURN(auto rs, c->Pipeline({{"BEGIN", {}},
                                                 db::ScopeTo(t),
                                                 {"SELECT upload_id::text FROM oml.upload_sessions WHERE tenant_id = $1 "
                                                  "AND state IN ('created', 'receiving') AND expires_at <= now() "
                                                  "ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
                                                  {db::Text(t), db::Int(kSweepBatch)}}}));
      const db::Rows& due = rs[2];
      if (due.size() == 0) break;
      for (int i = 0; i < due.size(); ++i) OML_RETURN_IF_ERROR(EndSession(*c, sys, due.Get(i, 0), State::kExpired));
      OML_RETURN_IF_ERROR(txn.Commit());
      rep.expired += due.size();
      if (due.size() < kSweepBatch) break;
    }
    // 2. Parts of final sessions.
    for (;;) {
      std::vector<std::string> ids;
      {
        OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
        OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(t, {"SELECT upload_id::text FROM oml.upload_sessions WHERE tenant_id = $1 "
                                                       "AND parts_left AND state NOT IN ('created', 'receiving') LIMIT $2",
                                                       {db::Text(t), db::Int(kSweepBatch)}}));
        for (int i = 0; i < r.size(); ++i) ids.push_back(r.Get(i, 0));
      }
      for (const auto& id : ids) OML_RETURN_IF_ERROR(RemoveParts(t, id, &rep.parts_removed));
      if (static_cast<int64_t>(ids.size()) < kSweepBatch) break;
    }
    // 3. Tombstones past their retention.
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows del, c->Scoped(t, {"DELETE FROM oml.upload_sessions WHERE tenant_id = $1 AND state IN "
                                                     "('failed', 'expired', 'cancelled') AND NOT parts_left "
                                                     "AND updated_at <= now() - make_interval(secs => $2)",
                                                     {db::Text(t), db::Int(static_cast<int64_t>(opts_.tombstone_retention.count()))}}));
    rep.rows_deleted += del.Affected();
  }
  return rep;
}

Sweeper::Sweeper(Uploads* uploads, std::chrono::milliseconds interval)
    : uploads_(uploads), interval_(interval), thread_([this] { Run(); }) {}

Sweeper::~Sweeper() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Sweeper::Run() {
  std::unique_lock<std::mutex> l(mu_);
  while (!cv_.wait_for(l, interval_, [this] { return stop_; })) {
    l.unlock();
    auto r = uploads_->Sweep();
    if (!r.ok()) {
      log::Warn("upload sweep failed (retried next interval)", {{"error", r.status().ToString()}});
    } else if (r->expired + r->parts_removed + r->rows_deleted > 0) {
      log::Info("upload sweep", {{"expired", r->expired}, {"parts_removed", r->parts_removed}, {"rows_deleted", r->rows_deleted}});
    }
    l.lock();
  }
}

}  // namespace oml::uploads
