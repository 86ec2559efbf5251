#include "uploads/uploads.h"

#include <sys/socket.h>

#include <array>
#include <cstdio>
#include <openssl/evp.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "common/log.h"
#include "common/sync_point.h"
#include "common/work_pool.h"
#include "uploads/running_sha256.h"

namespace oml::uploads {
namespace {

constexpr int64_t kSweepBatch = 100;
// First key of every session's advisory lock ("omlu"; the second is hashtext(tenant/upload_id)).
// The two-int4 key space, apart from the chains' bigint keys and the lake writer's "omlw".
constexpr int64_t kLockClass = 0x6f6d6c75;
// First key of a tenant's upload-quota lock ("omlq"; the second is hashtext(tenant)), held by
// Create's transaction.
constexpr int64_t kQuotaLockClass = 0x6f6d6c71;
constexpr unsigned char kStreamStateVersion = 0x01;
constexpr size_t kStreamStateFixed = 1 + 4 + crypto::kAeadNoncePrefixSize + 8 + 1;
// What a direct session on a local store encrypts and writes at a time (DoAppend: sliced).
constexpr size_t kWriteSliceBytes = size_t{256} << 10;

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
// States a session can expire from (expires_at: creation + expiry, or completion + complete_ttl).
bool Expirable(State s) { return Active(s) || s == State::kComplete; }

// Rolls back an open transaction on every early return.
struct TxnGuard {
  db::Conn& c;
  bool open = true;
  ~TxnGuard() {
    if (open) (void)c.Exec("ROLLBACK");
  }
};

std::string Digest(ChecksumAlgorithm a, std::string_view bytes) {
  if (a == ChecksumAlgorithm::kSha256) return crypto::Sha256(bytes);
  unsigned char md[20];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &n, EVP_sha1(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), n);
}

db::Stmt RequireLiveKey(const std::string& api_key_hash) {
  return {"SELECT oml.require_live_api_key($1)", {db::Bytes(api_key_hash)}, "oml_require_live_key"};
}

// Runs `stmt` in its own short transaction scoped to `tenant`, after the live-key check when
// `api_key_hash` is set: BEGIN; scope; [check]; stmt; COMMIT in one round trip. Returns stmt's
// rows. A guarded stmt (`... SELECT 1/count(*)`) that matched nothing is kInternal
// "zero-rows-guard" and nothing is committed.
Result<db::Rows> ShortTxn(db::Conn& c, const std::string& tenant, const std::string& api_key_hash, db::Stmt stmt) {
  std::vector<db::Stmt> stmts = {{"BEGIN", {}}, db::ScopeTo(tenant)};
  if (!api_key_hash.empty()) stmts.push_back(RequireLiveKey(api_key_hash));
  stmts.push_back(std::move(stmt));
  stmts.push_back({"COMMIT", {}});
  TxnGuard txn{c};
  OML_ASSIGN_OR_RETURN(std::vector<db::Rows> rs, c.Pipeline(stmts));
  txn.open = false;
  OML_RETURN_IF_ERROR(c.CommitVerdict(rs.back()));
  return std::move(rs[rs.size() - 2]);
}

// An object key this module names in object_key: `<tenant>/<64 hex digits>`.
bool OwnObjectKey(const std::string& tenant, const std::string& key) {
  static const std::regex kHex("^[0-9a-f]{64}$");
  return key.size() == tenant.size() + 65 && key.compare(0, tenant.size() + 1, tenant + "/") == 0 &&
         std::regex_match(key.substr(tenant.size() + 1), kHex);
}

void PutU32(uint32_t v, std::string* out) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(uint64_t v, std::string* out) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetBE(std::string_view b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

// Every column a session's handling reads, in this order (Row::Parse).
const char kColumns[] =
    "upload_id::text, state, upload_length, upload_offset, declared_sha256, coalesce(filename, ''), media_type, "
    "kek_id, wrapped_dek, segment_size, nonce_prefix, stream_sealed, plaintext_sha_sealed, ciphertext_sha_state, "
    "ciphertext_offset, part_count, floor(extract(epoch from expires_at))::bigint, (expires_at <= now()), principal, "
    "api_key_id, coalesce(object_key, ''), coalesce(upload_metadata, ''), direct, coalesce(store_upload, ''), "
    "array_to_json(store_parts)::text, carry_bytes";

}  // namespace

struct Uploads::Row {
  std::string upload_id;
  State state = State::kCreated;
  uint64_t length = 0, offset = 0;
  std::string declared_sha256, filename, media_type;
  std::string kek_id, wrapped_dek;  // empty once final (not complete)
  uint32_t segment_size = 0;
  std::string nonce_prefix;
  std::optional<std::string> stream_sealed, plaintext_sha_sealed, ciphertext_sha_state;
  uint64_t ciphertext_offset = 0;
  int64_t part_count = 0;
  int64_t expires_at = 0;
  bool overdue = false;
  std::string principal, api_key_id;
  std::string object_key;  // "" if none recorded
  std::string metadata;    // Upload-Metadata as sent; "" if not kept
  bool direct = false;      // chunks go straight into the object (sql/0027)
  std::string store_upload;             // the resumable write's handle; "" before the first part
  std::vector<std::string> store_parts; // S3 ETags of the committed parts
  uint64_t carry_bytes = 0;             // ciphertext in the carry object, not in a part yet

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
    if (!r.IsNull(i, 11)) w.stream_sealed = r.GetBytes(i, 11);
    if (!r.IsNull(i, 12)) w.plaintext_sha_sealed = r.GetBytes(i, 12);
    if (!r.IsNull(i, 13)) w.ciphertext_sha_state = r.GetBytes(i, 13);
    w.ciphertext_offset = static_cast<uint64_t>(r.GetInt(i, 14));
    w.part_count = r.GetInt(i, 15);
    w.expires_at = r.GetInt(i, 16);
    w.overdue = r.Get(i, 17) == "t";
    w.principal = r.Get(i, 18);
    w.api_key_id = r.Get(i, 19);
    w.object_key = r.Get(i, 20);
    w.metadata = r.Get(i, 21);
    w.direct = r.Get(i, 22) == "t";
    w.store_upload = r.Get(i, 23);
    auto tags = nlohmann::json::parse(r.Get(i, 24), nullptr, /*allow_exceptions=*/false);
    if (!tags.is_array()) return DataLoss("upload " + w.upload_id + " has malformed part tags", "integrity");
    for (const auto& e : tags) {
      if (!e.is_string()) return DataLoss("upload " + w.upload_id + " has malformed part tags", "integrity");
      w.store_parts.push_back(e.get<std::string>());
    }
    w.carry_bytes = static_cast<uint64_t>(r.GetInt(i, 25));
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
    s.metadata = metadata;
    return s;
  }
};

// A session's advisory lock on one pooled connection (uploads.h "Mutual exclusion"). Taken with
// TryStmt (in the caller's pipeline) or Try; released by the destructor, which must run while
// the connection is out of any transaction and before it goes back to the pool (declare the lock
// after the pool handle and before any TxnGuard). If the release cannot be confirmed, the
// connection's socket is shut down: the pool then drops the connection, and PostgreSQL ends the
// backend and every lock it held, so no pooled connection ever keeps a session's lock.
class Uploads::SessionLock {
 public:
  SessionLock(db::Conn& c, std::string tenant, std::string id) : c_(c), tenant_(std::move(tenant)), id_(std::move(id)) {}
  ~SessionLock() { Release(); }
  SessionLock(const SessionLock&) = delete;
  SessionLock& operator=(const SessionLock&) = delete;

  // `SELECT pg_try_advisory_lock(...)`: one row, "t" if taken. Report the outcome with Taken(),
  // or Unsure() if the pipeline that carried it failed.
  db::Stmt TryStmt() const {
    return {"SELECT pg_try_advisory_lock($1::int4, hashtext($2::text || '/' || $3::text))",
            {db::Int(kLockClass), db::Text(tenant_), db::Text(id_)},
            "oml_upload_lock"};
  }
  void Taken(bool held) { state_ = held ? kHeld : kFree; }
  void Unsure() { state_ = kUnsure; }
  bool held() const { return state_ == kHeld; }

  // Tries the lock in its own round trip.
  Result<bool> Try() {
    auto r = c_.Pipeline({TryStmt()});
    if (!r.ok()) {
      Unsure();
      return r.status();
    }
    Taken((*r)[0].Get(0, 0) == "t");
    return held();
  }

  void Release() {
    if (state_ == kFree) return;
    auto r = c_.Pipeline({{"SELECT pg_advisory_unlock($1::int4, hashtext($2::text || '/' || $3::text))",
                           {db::Int(kLockClass), db::Text(tenant_), db::Text(id_)},
                           "oml_upload_unlock"}});
    state_ = kFree;
    if (r.ok()) return;  // released (or, when unsure, it was never taken)
    log::Warn("upload lock not released; dropping its database connection",
              {{"upload", id_}, {"error", r.status().ToString()}});
    if (c_.raw() != nullptr && PQsocket(c_.raw()) >= 0) ::shutdown(PQsocket(c_.raw()), SHUT_RDWR);
  }

 private:
  enum LockState { kFree, kHeld, kUnsure };
  db::Conn& c_;
  const std::string tenant_, id_;
  LockState state_ = kFree;
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
std::string StreamAad(const std::string& tenant, const std::string& upload_id, uint64_t offset) {
  return "oml-upload-stream|" + tenant + "|" + upload_id + "|" + std::to_string(offset);
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
std::string StagingKey(const std::string& tenant, const std::string& upload_id) {
  return PartPrefix(tenant, upload_id) + "object";
}
std::string CarryKey(const std::string& tenant, const std::string& upload_id, uint64_t ciphertext_offset) {
  char n[32];
  std::snprintf(n, sizeof n, "carry-%016llu", static_cast<unsigned long long>(ciphertext_offset));
  return PartPrefix(tenant, upload_id) + n;
}
std::string ObjectKey(const std::string& tenant, const std::string& ciphertext_sha256_raw) {
  return tenant + "/" + crypto::Hex(ciphertext_sha256_raw);
}

std::string EncodeStreamState(const crypto::AeadEncryptorState& st) {
  std::string out;
  out.reserve(kStreamStateFixed + st.pending.size());  // no reallocation leaves plaintext behind
  out.push_back(static_cast<char>(kStreamStateVersion));
  PutU32(st.segment_size, &out);
  out.append(st.nonce_prefix);
  PutU64(st.next_segment, &out);
  out.push_back(st.header_sent ? 1 : 0);
  out.append(st.pending.view());
  return out;
}

Result<crypto::AeadEncryptorState> DecodeStreamState(std::string_view b) {
  if (b.size() < kStreamStateFixed || static_cast<unsigned char>(b[0]) != kStreamStateVersion ||
      static_cast<unsigned char>(b[kStreamStateFixed - 1]) > 1)
    return DataLoss("sealed upload stream state is malformed", "integrity");
  crypto::AeadEncryptorState st;
  st.segment_size = static_cast<uint32_t>(GetBE(b, 1, 4));
  st.nonce_prefix = std::string(b.substr(5, crypto::kAeadNoncePrefixSize));
  st.next_segment = GetBE(b, 5 + crypto::kAeadNoncePrefixSize, 8);
  st.header_sent = b[kStreamStateFixed - 1] == 1;
  std::string pending;
  pending.reserve(b.size() - kStreamStateFixed);
  pending.append(b.substr(kStreamStateFixed));
  st.pending = crypto::SecureBytes(std::move(pending));
  if (st.segment_size == 0 || st.pending.size() > st.segment_size)
    return DataLoss("sealed upload stream state is malformed", "integrity");
  return st;
}

bool StreamPositionMatches(const crypto::AeadEncryptorState& st, uint64_t offset) {
  if (st.segment_size == 0) return false;
  if (offset == 0) return !st.header_sent && st.next_segment == 0 && st.pending.empty();
  const uint64_t next = (offset - 1) / st.segment_size;
  return st.header_sent && st.next_segment == next && st.pending.size() == offset - next * st.segment_size;
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
  // A file larger than a pending-bytes quota could never be accepted: 413, not a 429 to retry.
  for (const auto& [limit, whose] : {std::pair{opts_.max_pending_bytes_per_key, "an API key's"},
                                     std::pair{opts_.max_pending_bytes_per_tenant, "a tenant's"}})
    if (limit > 0 && req.length > limit)
      return Status(Code::kPayloadTooLarge,
                    "Upload-Length " + std::to_string(req.length) + " exceeds " + whose +
                        " quota of pending upload bytes (" + std::to_string(limit) + ")",
                    "upload-too-large");
  const std::string id = crypto::NewUuidV4();
  const std::string& t = o.tenant_id;
  const crypto::SecureBytes dek(crypto::RandomBytes(32));  // wiped on every return
  OML_ASSIGN_OR_RETURN(std::string wrapped, kek_->Wrap(dek.view(), UploadDekAad(t, id)));
  OML_ASSIGN_OR_RETURN(auto enc, crypto::AeadStreamEncryptor::Create(dek.view(), AttachmentAad(t, id), opts_.segment_size));
  OML_ASSIGN_OR_RETURN(crypto::AeadEncryptorState st, enc->Suspend());
  OML_ASSIGN_OR_RETURN(std::string stream_sealed, crypto::EncryptAll(dek.view(), StreamAad(t, id, 0), EncodeStreamState(st)));
  const RunningSha256 fresh;
  OML_ASSIGN_OR_RETURN(std::string sha_sealed, crypto::EncryptAll(dek.view(), ShaStateAad(t, id, 0), fresh.State()));

  // One transaction: the tenant's quota lock, then (a statement of its own, so that its snapshot
  // sees every creation that committed before the lock was granted) the quota check and the
  // insert. The last statement answers the new expiry (NULL: over a quota) and the usage.
  const int64_t len = static_cast<int64_t>(req.length);
  auto limit = [](uint64_t v) { return v == 0 ? db::Null() : db::Int(static_cast<int64_t>(v)); };
  // READ COMMITTED whatever default_transaction_isolation says: the counting statement's
  // snapshot must be taken after the lock is granted, not at the transaction's first statement.
  std::vector<db::Stmt> stmts = {{"BEGIN ISOLATION LEVEL READ COMMITTED", {}}, db::ScopeTo(t)};
  if (!o.api_key_hash.empty()) stmts.push_back(RequireLiveKey(o.api_key_hash));
  stmts.push_back({"SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))", {db::Int(kQuotaLockClass), db::Text(t)}});
  stmts.push_back(
      {"WITH use AS (SELECT count(*) FILTER (WHERE api_key_id = $3) AS key_n, "
       "  coalesce(sum(upload_length - upload_offset) FILTER (WHERE api_key_id = $3), 0)::int8 AS key_b, "
       "  count(*) AS ten_n, coalesce(sum(upload_length - upload_offset), 0)::int8 AS ten_b "
       "  FROM oml.upload_sessions WHERE tenant_id = $1 AND state IN ('created', 'receiving') AND expires_at > now()), "
       "ins AS (INSERT INTO oml.upload_sessions (tenant_id, upload_id, api_key_id, principal, upload_length, "
       "  declared_sha256, filename, media_type, kek_id, wrapped_dek, segment_size, nonce_prefix, stream_sealed, "
       "  plaintext_sha_sealed, ciphertext_sha_state, expires_at, upload_metadata, direct) "
       "  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, now() + make_interval(secs => $16), $17, "
       "  true "
       "  FROM use WHERE ($18::int8 IS NULL OR key_n < $18) AND ($19::int8 IS NULL OR ten_n < $19) "
       "  AND ($20::int8 IS NULL OR key_b + $5::int8 <= $20) AND ($21::int8 IS NULL OR ten_b + $5::int8 <= $21) "
       "  RETURNING floor(extract(epoch from expires_at))::bigint AS e) "
       "SELECT (SELECT e FROM ins), key_n, key_b, ten_n, ten_b FROM use",
       {db::Text(t), db::Text(id), db::Text(o.api_key_id), db::Text(o.principal), db::Int(len),
        db::Bytes(req.plaintext_sha256), req.filename.empty() ? db::Null() : db::Text(req.filename),
        db::Text(req.media_type), db::Text(kek_->kek_id()), db::Bytes(wrapped), db::Int(opts_.segment_size),
        db::Bytes(st.nonce_prefix), db::Bytes(stream_sealed), db::Bytes(sha_sealed), db::Bytes(RunningSha256().State()),
        db::Int(static_cast<int64_t>(opts_.expiry.count())),
        req.metadata.empty() ? db::Null() : db::Text(req.metadata),
        limit(static_cast<uint64_t>(opts_.max_sessions_per_key)), limit(static_cast<uint64_t>(opts_.max_sessions_per_tenant)),
        limit(opts_.max_pending_bytes_per_key), limit(opts_.max_pending_bytes_per_tenant)}});
  stmts.push_back({"COMMIT", {}});
  db::Rows r;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());  // back in the pool before Append below
    TxnGuard txn{*c};
    OML_ASSIGN_OR_RETURN(std::vector<db::Rows> rs, c->Pipeline(stmts));
    txn.open = false;
    OML_RETURN_IF_ERROR(c->CommitVerdict(rs.back()));
    r = std::move(rs[rs.size() - 2]);
  }
  if (r.IsNull(0, 0)) {
    const int64_t key_n = r.GetInt(0, 1), key_b = r.GetInt(0, 2), ten_n = r.GetInt(0, 3), ten_b = r.GetInt(0, 4);
    std::string why;
    if (opts_.max_sessions_per_key > 0 && key_n >= opts_.max_sessions_per_key)
      why = "this API key has " + std::to_string(key_n) + " open upload sessions, the most it may hold";
    else if (opts_.max_sessions_per_tenant > 0 && ten_n >= opts_.max_sessions_per_tenant)
      why = "this tenant has " + std::to_string(ten_n) + " open upload sessions, the most it may hold";
    else if (opts_.max_pending_bytes_per_key > 0 && uint64_t(key_b) + req.length > opts_.max_pending_bytes_per_key)
      why = "this API key's open sessions await " + std::to_string(key_b) + " bytes; " + std::to_string(req.length) +
            " more would pass its limit of " + std::to_string(opts_.max_pending_bytes_per_key);
    else
      why = "this tenant's open sessions await " + std::to_string(ten_b) + " bytes; " + std::to_string(req.length) +
            " more would pass its limit of " + std::to_string(opts_.max_pending_bytes_per_tenant);
    return FailedPrecondition(why + "; finish or DELETE an upload, or retry later", "upload-quota-exceeded");
  }
  Session s;
  s.upload_id = id;
  s.state = State::kCreated;
  s.length = req.length;
  s.expires_at = r.GetInt(0, 0);
  s.declared_sha256 = req.plaintext_sha256;
  s.filename = req.filename;
  s.media_type = req.media_type;
  s.metadata = req.metadata;
  // Nothing to wait for: an empty file is complete (or failed) now.
  if (req.length == 0) return Append(o, id, 0, std::string_view(), std::nullopt);
  return s;
}

Result<std::optional<Uploads::Row>> Uploads::LockAndRead(db::Conn& c, SessionLock& lock, const Owner& o,
                                                         const std::string& id, bool live_key) {
  // The lock first, then the read, in one round trip: the read sees the last holder's commit.
  std::vector<db::Stmt> stmts = {lock.TryStmt(), {"BEGIN", {}}, db::ScopeTo(o.tenant_id)};
  if (live_key && !o.api_key_hash.empty()) stmts.push_back(RequireLiveKey(o.api_key_hash));
  stmts.push_back({std::string("SELECT ") + kColumns +
                       " FROM oml.upload_sessions WHERE tenant_id = $1 AND upload_id = $2 AND ($3 = '' OR api_key_id = $3)",
                   {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}});
  stmts.push_back({"COMMIT", {}});
  std::optional<Row> row;
  {
    TxnGuard txn{c};
    auto rs = c.Pipeline(stmts);
    if (!rs.ok()) {
      lock.Unsure();
      return rs.status();
    }
    txn.open = false;
    lock.Taken((*rs)[0].Get(0, 0) == "t");
    const db::Rows& r = (*rs)[rs->size() - 2];
    if (r.size() > 0) {
      OML_ASSIGN_OR_RETURN(row, Row::Parse(r, 0));
    }
  }
  return row;
}

Result<Session> Uploads::Head(const Owner& o, const std::string& id) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(o.tenant_id, {std::string("SELECT ") + kColumns +
                                                               " FROM oml.upload_sessions WHERE tenant_id = $1 "
                                                               "AND upload_id = $2 AND api_key_id = $3",
                                                           {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}}));
  if (r.size() == 0) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(Row row, Row::Parse(r, 0));
  OML_RETURN_IF_ERROR(EndedSessionRefusal(row.state, id));
  if (Expirable(row.state) && row.overdue) {
    // Expired on access, unless a request holds the session (it finds the session overdue
    // itself, or the sweep does later).
    OML_RETURN_IF_ERROR(ExpireIfOverdue(*c, o.tenant_id, id).status());
    return Expired(id);
  }
  return row.ToSession();
}

Result<Session> Uploads::Append(const Owner& o, const std::string& id, uint64_t offset, std::string_view bytes,
                                const std::optional<Checksum>& checksum, uint64_t* current) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  SessionLock lock(*c, o.tenant_id, id);  // released before c goes back to the pool
  OML_ASSIGN_OR_RETURN(std::optional<Row> got, LockAndRead(*c, lock, o, id, /*live_key=*/true));
  if (!got || got->state == State::kCancelled) return NotFoundUpload(id);
  Row& row = *got;
  if (current) *current = row.offset;
  OML_RETURN_IF_ERROR(EndedSessionRefusal(row.state, id));
  if (!lock.held())
    return FailedPrecondition("another request is appending to upload " + id + "; retry after HEAD", "upload-busy");
  if (Expirable(row.state) && row.overdue) {
    OML_ASSIGN_OR_RETURN(bool ended, EndSession(*c, o.tenant_id, id, State::kExpired, /*only_overdue=*/true));
    if (ended) RemoveLeftoversOrLog(*c, o.tenant_id, id);
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
  if (!bytes.empty() && bytes.size() < opts_.min_chunk_bytes && offset + bytes.size() < row.length)
    return InvalidArgument("a chunk that does not end the upload must hold at least " +
                               std::to_string(opts_.min_chunk_bytes) + " bytes; this one holds " +
                               std::to_string(bytes.size()),
                           "upload-chunk-too-small");
  if (checksum && !crypto::ConstantTimeEquals(Digest(checksum->algorithm, bytes), checksum->digest))
    return InvalidArgument("the chunk does not match its Upload-Checksum; it was discarded", "checksum-mismatch");
  return DoAppend(*c, o, row, offset, bytes);
}

// REQUIRES: c holds the session's lock and no transaction; the row is active, at `offset`, and
// the chunk fits. Every write below is a short transaction guarded on the offset read.
Result<Session> Uploads::DoAppend(db::Conn& c, const Owner& o, Row& row, uint64_t offset, std::string_view bytes) {
  const std::string& t = o.tenant_id;
  const std::string& id = row.upload_id;
  const uint64_t new_offset = offset + bytes.size();
  const bool last = new_offset == row.length;
  if (bytes.empty() && !last) return row.ToSession();
  if (row.wrapped_dek.empty() || !row.stream_sealed || !row.plaintext_sha_sealed || !row.ciphertext_sha_state)
    return DataLoss("upload " + id + " has no key, stream or hash state", "integrity");
  auto dek = kek_->UnwrapFrom(row.kek_id, row.wrapped_dek, UploadDekAad(t, id));
  if (!dek.ok() && dek.status().type() == "kek-unavailable") return dek.status();
  if (!dek.ok()) return DataLoss("DEK of upload " + id + " does not unwrap", "integrity");

  // The stream and both hashes as the last commit left them: the stream state must open under
  // this offset and stand where this offset puts it, else nothing is sealed (a rewound stream
  // would seal new plaintext under nonces already used).
  crypto::AeadEncryptorState st;
  {
    auto opened = crypto::DecryptAll(dek->view(), StreamAad(t, id, offset), *row.stream_sealed);
    if (!opened.ok()) return DataLoss("the stream state of upload " + id + " does not open at its offset", "integrity");
    auto decoded = DecodeStreamState(*opened);
    crypto::Wipe(&*opened);
    if (!decoded.ok()) return decoded.status();
    st = std::move(decoded).value();
  }
  if (st.segment_size != row.segment_size || st.nonce_prefix != row.nonce_prefix || !StreamPositionMatches(st, offset) ||
      row.ciphertext_offset != (st.header_sent ? crypto::kAeadHeaderSize : 0) +
                                   st.next_segment * (uint64_t{st.segment_size} + crypto::kAeadTagSize))
    return DataLoss("the stream state of upload " + id + " is not at its offset", "integrity");
  auto sha_bytes = crypto::DecryptAll(dek->view(), ShaStateAad(t, id, offset), *row.plaintext_sha_sealed);
  if (!sha_bytes.ok()) return DataLoss("hash state of upload " + id + " does not decrypt", "integrity");
  auto pt_sha = RunningSha256::FromState(*sha_bytes);
  crypto::Wipe(&*sha_bytes);
  if (!pt_sha.ok()) return pt_sha.status();
  OML_ASSIGN_OR_RETURN(RunningSha256 ct_sha, RunningSha256::FromState(*row.ciphertext_sha_state));
  if (pt_sha->length() != offset) return DataLoss("hash state of upload " + id + " is not at its offset", "integrity");
  OML_ASSIGN_OR_RETURN(auto enc, crypto::AeadStreamEncryptor::Resume(dek->view(), AttachmentAad(t, id), std::move(st)));

  // Direct sessions on a store without a minimum part (a local directory) encrypt and write the
  // chunk in slices of kWriteSliceBytes (fsynced once, after the last), so a PATCH holds its body
  // and two slices of ciphertext, not the whole chunk's (uploads.h "Memory"). A retried last chunk
  // whose object may already be in place (object_key recorded) takes the whole-chunk path: it must
  // know the object's name before it writes.
  const bool sliced = row.direct && !bytes.empty() && store_->ResumableMinPart() == 0 && row.object_key.empty();
  std::string ct;
  if (!sliced) {
    OML_ASSIGN_OR_RETURN(ct, enc->Update(bytes));
    pt_sha->Update(bytes);
  }

  // Shared by both layouts. Records the object's key in the row before the object can exist.
  auto record_object_key = [&](const std::string& key) -> Status {
    return ShortTxn(c, t, o.api_key_hash,
                    {"WITH u AS (UPDATE oml.upload_sessions SET object_key = $3, updated_at = now() WHERE tenant_id = $1 "
                     "AND upload_id = $2 AND upload_offset = $4 AND state IN ('created', 'receiving') RETURNING 1) "
                     "SELECT 1/count(*) FROM u",
                     {db::Text(t), db::Text(id), db::Text(key), db::Int(static_cast<int64_t>(offset))}})
        .status();
  };
  // Commits the completion (the object is in place at `key`), removes what the session left, and
  // answers the session.
  auto complete = [&](uint64_t ct_size, const std::string& ct_digest, const std::string& key) -> Result<Session> {
    OML_ASSIGN_OR_RETURN(
        db::Rows done,
        ShortTxn(c, t, o.api_key_hash,
                 {"WITH u AS (UPDATE oml.upload_sessions SET state = 'complete', upload_offset = upload_length, "
                  "stream_sealed = NULL, plaintext_sha_sealed = NULL, ciphertext_sha_state = NULL, "
                  "ciphertext_offset = $3, parts_left = true, completed_at = now(), updated_at = now(), "
                  "expires_at = now() + make_interval(secs => $7), plaintext_sha256 = declared_sha256, "
                  "ciphertext_sha256 = $4, ciphertext_size = $3, object_key = $5, carry_bytes = 0 "
                  "WHERE tenant_id = $1 AND upload_id = $2 AND upload_offset = $6 AND state IN ('created', 'receiving') "
                  "RETURNING floor(extract(epoch from expires_at))::bigint AS e) SELECT max(e), 1/count(*) FROM u",
                  {db::Text(t), db::Text(id), db::Int(static_cast<int64_t>(ct_size)), db::Bytes(ct_digest),
                   db::Text(key), db::Int(static_cast<int64_t>(offset)),
                   db::Int(static_cast<int64_t>(opts_.complete_ttl.count()))}}));
    RemoveLeftoversOrLog(c, t, id);  // parts, carries
    row.state = State::kComplete;
    row.offset = new_offset;
    if (done.size() == 1) row.expires_at = done.GetInt(0, 0);
    return row.ToSession();
  };
  // The stream and plaintext hash states at new_offset, sealed (uploads.h "Encryption"); wipes the DEK.
  auto seal_position = [&]() -> Result<std::pair<std::string, std::string>> {
    OML_ASSIGN_OR_RETURN(crypto::AeadEncryptorState next, enc->Suspend());
    std::string stream_plain = EncodeStreamState(next);
    auto stream_sealed = crypto::EncryptAll(dek->view(), StreamAad(t, id, new_offset), stream_plain);
    crypto::Wipe(&stream_plain);
    std::string sha_state = pt_sha->State();
    auto sha_sealed = crypto::EncryptAll(dek->view(), ShaStateAad(t, id, new_offset), sha_state);
    crypto::Wipe(&sha_state);
    dek->Wipe();
    if (!stream_sealed.ok()) return stream_sealed.status();
    if (!sha_sealed.ok()) return sha_sealed.status();
    return std::pair{std::move(*stream_sealed), std::move(*sha_sealed)};
  };

  if (row.direct) {
    // Straight into the object (uploads.h "Storage"): the carry (ciphertext not in a part yet)
    // and this chunk's ciphertext go out as the next part once they reach the store's minimum,
    // or at the last byte; below it they become the next carry object.
    const std::string staging = StagingKey(t, id);
    std::string handle = row.store_upload;
    // Starts the session's write, recorded before any part is put: every write a session starts
    // is one its end aborts (the staging sweep leaves session writes alone). A crash before the
    // record leaves a write without parts.
    auto ensure_handle = [&]() -> Status {
      if (!handle.empty()) return Status::Ok();
      OML_ASSIGN_OR_RETURN(handle, store_->ResumableStart(staging));
      Status recorded =
          ShortTxn(c, t, o.api_key_hash,
                   {"WITH u AS (UPDATE oml.upload_sessions SET store_upload = $3, parts_left = true, "
                    "updated_at = now() WHERE tenant_id = $1 AND upload_id = $2 AND upload_offset = $4 AND "
                    "state IN ('created', 'receiving') AND store_upload IS NULL RETURNING 1) SELECT 1/count(*) FROM u",
                    {db::Text(t), db::Text(id), db::Text(handle), db::Int(static_cast<int64_t>(offset))}})
              .status();
      if (!recorded.ok()) {
        // Not recorded: no one would abort it. (A kill -9 right here leaves one without parts.)
        (void)store_->ResumableAbort(staging, handle);
        return recorded;
      }
      row.store_upload = handle;
      return Status::Ok();
    };
    // `ct` itself when nothing is carried (no copy of the chunk), else the carry and ct.
    auto with_carry = [&](std::string& mine) -> Result<std::string> {
      if (row.carry_bytes == 0) return std::move(mine);
      const std::string_view more = mine;
      OML_ASSIGN_OR_RETURN(std::optional<std::string> got, store_->Get(CarryKey(t, id, row.ciphertext_offset)));
      if (!got || got->size() != row.carry_bytes)
        return DataLoss("the carried ciphertext of upload " + id + " is missing or not its size; DELETE the upload "
                        "and upload the file again",
                        "integrity");
      got->append(more);
      std::string().swap(mine);  // freed: the carry holds a copy
      return std::move(*got);
    };
    auto lost = [&](Status s) {
      if (s.code() != Code::kNotFound) return s;
      return DataLoss("the stored part of upload " + id + " is gone (" + s.message() +
                          "); DELETE the upload and upload the file again",
                      "integrity");
    };
    // Before its write starts, a direct session's ciphertext is all in the carry. A row where it is
    // not was advanced by a server that wrote it another way (a previous version during a rolling
    // upgrade writes part objects): refused, never completed from part of its bytes.
    if (handle.empty() && row.ciphertext_offset != row.carry_bytes)
      return DataLoss("upload " + id + " holds " + std::to_string(row.ciphertext_offset) +
                          " bytes of ciphertext outside its write; DELETE the upload and upload the file again",
                      "integrity");
    // Likewise once an S3 write has started: each committed part has its ETag, in order.
    if (!handle.empty() && store_->ResumableMinPart() > 0 &&
        row.store_parts.size() != static_cast<size_t>(row.part_count))
      return DataLoss("upload " + id + " counts " + std::to_string(row.part_count) + " parts but holds " +
                          std::to_string(row.store_parts.size()) +
                          " part tags; DELETE the upload and upload the file again",
                      "integrity");
    // Sliced: each slice's ciphertext at its offset in the staging file, not yet fsynced.
    uint64_t written = 0;  // ciphertext bytes the slices wrote
    auto write_piece = [&](const std::string& piece, bool sync, bool hashed = false) -> Status {
      if (piece.empty() && !sync) return Status::Ok();
      OML_RETURN_IF_ERROR(ensure_handle());
      auto put = store_->ResumablePut(staging, handle, static_cast<uint32_t>(row.part_count + 1),
                                      row.ciphertext_offset + written, piece, sync);
      if (!put.ok()) return lost(put.status());
      if (!hashed) ct_sha.Update(piece);
      written += piece.size();
      return Status::Ok();
    };
    if (sliced) {
      // Two helper threads (common/work_pool.h): one hashes the chunk's plaintext (it needs only
      // `bytes`, all here) from the start; the other writes slice n (the direct write waits for
      // the device) while slice n+1 is sealed and its ciphertext hashed here. A group's tasks run
      // one at a time, in order, so `written` moves as in a loop. The groups, declared after
      // `pieces` and `wrote`, wait for their tasks before those, pt_sha or `bytes` can go.
      OML_RETURN_IF_ERROR(ensure_handle());  // its transaction on `c`, here, before any thread writes
      std::array<std::string, 2> pieces;     // reused: no fresh, zero-filled pages per slice
      Status wrote;  // the first failed write; none is queued after it (read after writing.Wait())
      WorkPool helpers(2);
      WorkPool::Group hashing(helpers), writing(helpers);  // last: they wait before `wrote` goes
      hashing.Add([&pt_sha, bytes] { pt_sha->Update(bytes); });
      size_t cur = 0;
      for (size_t at = 0; at < bytes.size(); at += kWriteSliceBytes) {
        const std::string_view slice = bytes.substr(at, kWriteSliceBytes);
        OML_RETURN_IF_ERROR(enc->UpdateInto(slice, &pieces[cur]));
        ct_sha.Update(pieces[cur]);
        writing.Wait();  // slice n-1's write: pieces[cur] was written before it
        OML_RETURN_IF_ERROR(wrote);
        writing.Add([&write_piece, &wrote, piece = &pieces[cur]] {
          wrote = write_piece(*piece, /*sync=*/false, /*hashed=*/true);
        });
        cur ^= 1;
      }
      writing.Wait();
      hashing.Wait();
      OML_RETURN_IF_ERROR(wrote);
    }
    if (last) {
      dek->Wipe();
      OML_ASSIGN_OR_RETURN(std::string tail, enc->Finish());
      if (sliced) {
        OML_RETURN_IF_ERROR(write_piece(tail, /*sync=*/true));  // the tail, and every slice durable
      } else {
        ct += tail;
      }
      if (!crypto::ConstantTimeEquals(pt_sha->Digest(), row.declared_sha256)) {
        OML_ASSIGN_OR_RETURN(bool ended, EndSession(c, t, id, State::kFailed, /*only_overdue=*/false));
        if (ended) RemoveLeftoversOrLog(c, t, id);
        return InvalidArgument("the file's SHA-256 is not the declared sha256; the upload failed and its data was removed",
                               "digest-mismatch");
      }
      ct_sha.Update(ct);  // (empty when sliced: the pieces were hashed as they went out)
      const std::string ct_digest = ct_sha.Digest();
      const uint64_t ct_size = row.ciphertext_offset + written + ct.size();
      const std::string key = ObjectKey(t, ct_digest);
      // Named in the row before it can exist (as for composed objects below).
      const bool named_before = row.object_key == key;
      if (!named_before) {
        OML_RETURN_IF_ERROR(record_object_key(key));
        row.object_key = key;
      }
      OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.complete.before_object"));
      // A retry after a crash that came after the object appeared: it is in place.
      bool placed = false;
      if (named_before) {
        OML_ASSIGN_OR_RETURN(std::optional<uint64_t> have, store_->Size(key));
        placed = have && *have == ct_size;
      }
      if (!placed && sliced) {
        OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.complete.before_finish"));
        OML_RETURN_IF_ERROR(lost(store_->ResumableFinish(staging, handle, {}, ct_size, key)));
      } else if (!placed) {
        OML_ASSIGN_OR_RETURN(std::string out, with_carry(ct));
        ct.clear();
        ct.shrink_to_fit();
        if (row.store_upload.empty()) {
          // Nothing went out as a part: the carry and this chunk are the whole object.
          OML_RETURN_IF_ERROR(store_->Put(key, out));
        } else {
          std::vector<std::string> tags = row.store_parts;
          if (!out.empty()) {
            auto tag = store_->ResumablePut(staging, row.store_upload, static_cast<uint32_t>(row.part_count + 1),
                                            ct_size - out.size(), out, /*sync=*/true);
            if (tag.ok()) {
              tags.push_back(*tag);
            } else if (!(named_before && tag.status().code() == Code::kNotFound)) {
              // (named before and gone: a crash after the write was completed; Finish carries on)
              return lost(tag.status());
            }
          }
          OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.complete.before_finish"));
          OML_RETURN_IF_ERROR(lost(store_->ResumableFinish(staging, row.store_upload, tags, ct_size, key)));
        }
      }
      OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.complete.after_object"));
      return complete(ct_size, ct_digest, key);
    }

    ct_sha.Update(ct);  // (empty when sliced)
    const uint64_t ct_end = row.ciphertext_offset + written + ct.size();
    const uint64_t carry = row.carry_bytes + ct.size();
    std::optional<std::string> tag;
    int64_t parts = row.part_count;
    uint64_t new_carry = row.carry_bytes;
    if (written > 0) {
      // Every slice durable before the offset moves: an empty put that fsyncs the file.
      auto synced = store_->ResumablePut(staging, handle, static_cast<uint32_t>(parts + 1), ct_end, "", /*sync=*/true);
      if (!synced.ok()) return lost(synced.status());
      ++parts;
    }
    if (!ct.empty()) {
      OML_ASSIGN_OR_RETURN(std::string out, with_carry(ct));
      ct.clear();
      ct.shrink_to_fit();
      if (carry >= std::max<uint64_t>(store_->ResumableMinPart(), 1)) {
        OML_RETURN_IF_ERROR(ensure_handle());
        auto put = store_->ResumablePut(staging, handle, static_cast<uint32_t>(parts + 1), ct_end - carry, out,
                                        /*sync=*/true);
        if (!put.ok()) return lost(put.status());
        tag = std::move(*put);
        ++parts;
        new_carry = 0;
      } else {
        OML_RETURN_IF_ERROR(store_->Put(CarryKey(t, id, ct_end), out));
        new_carry = carry;
      }
    }
    OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.append.after_part"));
    OML_ASSIGN_OR_RETURN(auto sealed, seal_position());
    // S3 tags are kept; a local store's parts need none.
    const bool keep_tag = tag && store_->ResumableMinPart() > 0;
    OML_RETURN_IF_ERROR(
        ShortTxn(c, t, o.api_key_hash,
                 {"WITH u AS (UPDATE oml.upload_sessions SET state = 'receiving', upload_offset = $3, stream_sealed = $4, "
                  "plaintext_sha_sealed = $5, ciphertext_sha_state = $6, ciphertext_offset = $7, part_count = $8, "
                  "parts_left = parts_left OR $8 > 0 OR $12 > 0, updated_at = now(), store_upload = $10, "
                  "store_parts = CASE WHEN $11::text IS NULL THEN store_parts ELSE array_append(store_parts, $11::text) END, "
                  "carry_bytes = $12 "
                  "WHERE tenant_id = $1 AND upload_id = $2 AND upload_offset = $9 AND state IN ('created', 'receiving') "
                  "RETURNING 1) SELECT 1/count(*) FROM u",
                  {db::Text(t), db::Text(id), db::Int(static_cast<int64_t>(new_offset)), db::Bytes(sealed.first),
                   db::Bytes(sealed.second), db::Bytes(ct_sha.State()), db::Int(static_cast<int64_t>(ct_end)),
                   db::Int(parts), db::Int(static_cast<int64_t>(offset)),
                   handle.empty() ? db::Null() : db::Text(handle), keep_tag ? db::Text(*tag) : db::Null(),
                   db::Int(static_cast<int64_t>(new_carry))}})
            .status());
    // The carry this chunk consumed or replaced (RemoveLeftovers takes it otherwise).
    if (row.carry_bytes > 0 && ct_end != row.ciphertext_offset) {
      if (Status s = store_->Delete(CarryKey(t, id, row.ciphertext_offset)); !s.ok())
        log::Warn("upload: a consumed carry object was not deleted", {{"upload", id}, {"error", s.ToString()}});
    }
    row.state = State::kReceiving;
    row.offset = new_offset;
    return row.ToSession();
  }

  if (last) {
    dek->Wipe();
    OML_ASSIGN_OR_RETURN(std::string tail, enc->Finish());
    ct += tail;
    if (!crypto::ConstantTimeEquals(pt_sha->Digest(), row.declared_sha256)) {
      // The whole file is not the declared one: the session fails and keeps nothing.
      OML_ASSIGN_OR_RETURN(bool ended, EndSession(c, t, id, State::kFailed, /*only_overdue=*/false));
      if (ended) RemoveLeftoversOrLog(c, t, id);
      return InvalidArgument("the file's SHA-256 is not the declared sha256; the upload failed and its data was removed",
                             "digest-mismatch");
    }
    ct_sha.Update(ct);
    const std::string ct_digest = ct_sha.Digest();
    const uint64_t ct_size = row.ciphertext_offset + ct.size();
    const std::string key = ObjectKey(t, ct_digest);
    // Name the object in the row before it can exist: a crash after it appears leaves a row
    // that names it, and the session's end deletes it. (The same committed state and bytes
    // always compose the same object, so a retry records the same key.)
    if (row.object_key != key) {
      OML_RETURN_IF_ERROR(record_object_key(key));
      if (!row.object_key.empty() && OwnObjectKey(t, row.object_key)) {
        if (Status s = store_->Delete(row.object_key); !s.ok())
          log::Warn("upload: an earlier composed object was not deleted", {{"upload", id}, {"error", s.ToString()}});
      }
      row.object_key = key;
    }
    // Compose parts 1..part_count and the final bytes into the object, outside any transaction,
    // re-hashing what the store returns: a part that is not what was put is kDataLoss, and no
    // object appears.
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
      // Every byte is in the writer, nothing visible yet (a kill here leaves a staging file or an
      // incomplete multipart upload: blob::ObjectStore::SweepStaging).
      if (Status s = OML_SYNC_POINT("uploads.complete.before_finish"); !s.ok()) return fail(s);
      OML_RETURN_IF_ERROR(w->Finish());
    }
    OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.complete.after_object"));
    return complete(ct_size, ct_digest, key);
  }

  // Not the last byte: the whole segments go out as the next part (before the offset moves),
  // the tail stays in the sealed stream state.
  ct_sha.Update(ct);
  int64_t parts = row.part_count;
  if (!ct.empty()) {
    ++parts;
    OML_RETURN_IF_ERROR(store_->Put(PartKey(t, id, parts), ct));
  }
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("uploads.append.after_part"));
  OML_ASSIGN_OR_RETURN(auto sealed, seal_position());
  OML_RETURN_IF_ERROR(
      ShortTxn(c, t, o.api_key_hash,
               {"WITH u AS (UPDATE oml.upload_sessions SET state = 'receiving', upload_offset = $3, stream_sealed = $4, "
                "plaintext_sha_sealed = $5, ciphertext_sha_state = $6, ciphertext_offset = $7, part_count = $8, "
                "parts_left = parts_left OR $8 > 0, updated_at = now() "
                "WHERE tenant_id = $1 AND upload_id = $2 AND upload_offset = $9 AND state IN ('created', 'receiving') "
                "RETURNING 1) SELECT 1/count(*) FROM u",
                {db::Text(t), db::Text(id), db::Int(static_cast<int64_t>(new_offset)), db::Bytes(sealed.first),
                 db::Bytes(sealed.second), db::Bytes(ct_sha.State()),
                 db::Int(static_cast<int64_t>(row.ciphertext_offset + ct.size())), db::Int(parts),
                 db::Int(static_cast<int64_t>(offset))}})
          .status());
  row.state = State::kReceiving;
  row.offset = new_offset;
  return row.ToSession();
}

Status Uploads::Cancel(const Owner& o, const std::string& id) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  SessionLock lock(*c, o.tenant_id, id);
  OML_ASSIGN_OR_RETURN(std::optional<Row> row, LockAndRead(*c, lock, o, id, /*live_key=*/false));
  if (!row || row->state == State::kCancelled) return NotFoundUpload(id);
  OML_RETURN_IF_ERROR(EndedSessionRefusal(row->state, id));
  if (!lock.held()) return FailedPrecondition("another request is appending to upload " + id + "; retry", "upload-busy");
  const State to = row->overdue ? State::kExpired : State::kCancelled;
  OML_ASSIGN_OR_RETURN(bool ended, EndSession(*c, o.tenant_id, id, to, /*only_overdue=*/false));
  // Not ended: a claim attached the complete session meanwhile (its row is gone).
  if (!ended) return NotFoundUpload(id);
  RemoveLeftoversOrLog(*c, o.tenant_id, id);
  if (to == State::kExpired) return Expired(id);
  return Status::Ok();
}

Result<bool> Uploads::EndSession(db::Conn& c, const std::string& tenant, const std::string& id, State to,
                                 bool only_overdue) {
  // parts_left: a part put by a chunk whose commit never came is not counted in part_count, and
  // object_key may name an object, so every ended session has its leftovers looked for once
  // (RemoveLeftovers). The object of a complete session goes with its DEK.
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      ShortTxn(c, tenant, "",
               {std::string("UPDATE oml.upload_sessions SET state = $3, kek_id = NULL, wrapped_dek = NULL, "
                            "stream_sealed = NULL, plaintext_sha_sealed = NULL, ciphertext_sha_state = NULL, "
                            "parts_left = true, updated_at = now() WHERE tenant_id = $1 AND upload_id = $2 AND "
                            "(state IN ('created', 'receiving') OR (state = 'complete' AND $3 IN ('expired', 'cancelled')))") +
                    (only_overdue ? " AND expires_at <= now()" : "") + " RETURNING 1",
                {db::Text(tenant), db::Text(id), db::Text(StateName(to))}}));
  return r.size() == 1;
}

Result<bool> Uploads::ExpireIfOverdue(db::Conn& c, const std::string& tenant, const std::string& id,
                                      SweepReport* counts) {
  SessionLock lock(c, tenant, id);
  OML_ASSIGN_OR_RETURN(bool held, lock.Try());
  if (!held) return false;
  OML_ASSIGN_OR_RETURN(bool ended, EndSession(c, tenant, id, State::kExpired, /*only_overdue=*/true));
  if (ended) RemoveLeftoversOrLog(c, tenant, id, counts);
  return ended;
}

Status Uploads::RemoveLeftovers(db::Conn& c, const std::string& tenant, const std::string& id, SweepReport* counts) {
  OML_ASSIGN_OR_RETURN(db::Rows r, c.Scoped(tenant, {"SELECT state, object_key, store_upload FROM oml.upload_sessions "
                                                     "WHERE tenant_id = $1 AND upload_id = $2",
                                                     {db::Text(tenant), db::Text(id)}}));
  const bool found = r.size() == 1;
  const std::string state = found ? r.Get(0, 0) : "";
  const std::optional<std::string> object = found && !r.IsNull(0, 1) ? std::optional<std::string>(r.Get(0, 1)) : std::nullopt;
  const std::string store_upload = found && !r.IsNull(0, 2) ? r.Get(0, 2) : "";
  // An active session's parts are its data. A row that is gone was attached (or deleted as a
  // tombstone): its parts are no one's, its object (if attached) the claim's.
  if (state == "created" || state == "receiving") return Status::Ok();
  // The resumable write of a session that ended without completing (a complete one's was
  // completed): S3 frees its parts; locally its staging file goes (and with the prefix below).
  if (!store_upload.empty() && state != "complete") {
    OML_RETURN_IF_ERROR(store_->ResumableAbort(StagingKey(tenant, id), store_upload));
    if (counts) ++counts->parts_removed;  // the write and every part in it
  }
  OML_ASSIGN_OR_RETURN(std::vector<std::string> keys, store_->List(PartPrefix(tenant, id)));
  for (const auto& k : keys) {
    OML_RETURN_IF_ERROR(store_->Delete(k));
    if (counts) ++counts->parts_removed;
  }
  if (!found) return Status::Ok();
  if (state != "complete" && object) {
    if (OwnObjectKey(tenant, *object)) {
      OML_RETURN_IF_ERROR(store_->Delete(*object));
      if (counts) ++counts->objects_removed;
    } else {
      // Not a name this module writes: never delete what it may name; forget it.
      log::Warn("upload names an object that is not an upload object; not deleted", {{"upload", id}});
    }
  }
  // Only if nothing changed since the read (the lock excludes every writer but the claim that
  // attaches a complete session, which deletes the row).
  return c
      .Scoped(tenant, {"UPDATE oml.upload_sessions SET parts_left = false, store_upload = NULL, "
                       "object_key = CASE WHEN state = 'complete' THEN object_key END "
                       "WHERE tenant_id = $1 AND upload_id = $2 AND state = $3 AND object_key IS NOT DISTINCT FROM $4",
                       {db::Text(tenant), db::Text(id), db::Text(state), object ? db::Text(*object) : db::Null()}})
      .status();
}

void Uploads::RemoveLeftoversOrLog(db::Conn& c, const std::string& tenant, const std::string& id,
                                   SweepReport* counts) {
  if (Status s = RemoveLeftovers(c, tenant, id, counts); !s.ok())
    log::Warn("upload leftovers not removed yet (the sweep retries)", {{"upload", id}, {"error", s.ToString()}});
}

Result<CompletedUpload> Uploads::LookupCompleted(const Owner& o, const std::string& id) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  TxnGuard txn{*c};
  OML_RETURN_IF_ERROR(c->Pipeline({{"BEGIN", {}}, db::ScopeTo(o.tenant_id)}).status());
  OML_ASSIGN_OR_RETURN(CompletedUpload u, LookupCompleted(*c, o, id, /*lock=*/false));
  txn.open = false;
  OML_ASSIGN_OR_RETURN(db::Rows r, c->Query("COMMIT"));
  OML_RETURN_IF_ERROR(c->CommitVerdict(r));
  return u;
}

Result<CompletedUpload> Uploads::LookupCompleted(db::Conn& tx, const Owner& o, const std::string& id, bool lock) {
  if (!ValidUuid(id)) return NotFoundUpload(id);
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      tx.Query(std::string("SELECT state, api_key_id, principal, upload_length, plaintext_sha256, ciphertext_sha256, "
                           "ciphertext_size, media_type, coalesce(filename, ''), object_key, wrapped_dek, kek_id, "
                           "extract(epoch from completed_at)::bigint, (expires_at <= now()) FROM oml.upload_sessions "
                           "WHERE tenant_id = $1 AND upload_id = $2 AND api_key_id = $3") +
                   (lock ? " FOR SHARE" : ""),
               {db::Text(o.tenant_id), db::Text(id), db::Text(o.api_key_id)}));
  if (r.size() == 0 || r.Get(0, 0) == "cancelled") return NotFoundUpload(id);
  if (r.Get(0, 0) != "complete") return NotFound("upload " + id + " is " + r.Get(0, 0) + ", not complete", "upload-not-found");
  if (r.Get(0, 13) == "t") return NotFound("upload " + id + " is expired, not complete", "upload-not-found");
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
  OML_ASSIGN_OR_RETURN(db::Pool::Handle c, pool_->Acquire());
  {
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Query("SELECT t::text FROM oml.upload_sweep_tenants(make_interval(secs => $1)) t",
                                              {db::Int(static_cast<int64_t>(opts_.tombstone_retention.count()))}));
    for (int i = 0; i < r.size(); ++i) tenants.push_back(r.Get(i, 0));
  }
  // Each batch goes on while it made progress: a batch of sessions whose locks are all held
  // (requests in progress) ends the loop; the next sweep takes them.
  auto ids_of = [&](const std::string& t, const char* sql) -> Result<std::vector<std::string>> {
    OML_ASSIGN_OR_RETURN(db::Rows r, c->Scoped(t, {sql, {db::Text(t), db::Int(kSweepBatch)}}));
    std::vector<std::string> ids;
    for (int i = 0; i < r.size(); ++i) ids.push_back(r.Get(i, 0));
    return ids;
  };
  for (const std::string& t : tenants) {
    // 1. Overdue sessions: active ones past their expiry, complete ones past complete_ttl.
    for (;;) {
      OML_ASSIGN_OR_RETURN(std::vector<std::string> due,
                           ids_of(t, "SELECT upload_id::text FROM oml.upload_sessions WHERE tenant_id = $1 "
                                     "AND state IN ('created', 'receiving', 'complete') AND expires_at <= now() "
                                     "ORDER BY expires_at LIMIT $2"));
      int64_t done = 0;
      for (const auto& id : due) {
        OML_ASSIGN_OR_RETURN(bool expired, ExpireIfOverdue(*c, t, id, &rep));
        if (expired) ++done;
      }
      rep.expired += done;
      if (done == 0 || static_cast<int64_t>(due.size()) < kSweepBatch) break;
    }
    // 2. What ended sessions left (parts, objects), and parts of complete ones.
    for (;;) {
      OML_ASSIGN_OR_RETURN(std::vector<std::string> ids,
                           ids_of(t, "SELECT upload_id::text FROM oml.upload_sessions WHERE tenant_id = $1 "
                                     "AND parts_left AND state NOT IN ('created', 'receiving') LIMIT $2"));
      int64_t done = 0;
      for (const auto& id : ids) {
        SessionLock lock(*c, t, id);
        OML_ASSIGN_OR_RETURN(bool held, lock.Try());
        if (!held) continue;
        OML_RETURN_IF_ERROR(RemoveLeftovers(*c, t, id, &rep));
        ++done;
      }
      if (done == 0 || static_cast<int64_t>(ids.size()) < kSweepBatch) break;
    }
    // 3. Tombstones past their retention.
    OML_ASSIGN_OR_RETURN(db::Rows del, c->Scoped(t, {"DELETE FROM oml.upload_sessions WHERE tenant_id = $1 AND state IN "
                                                     "('failed', 'expired', 'cancelled') AND NOT parts_left "
                                                     "AND updated_at <= now() - make_interval(secs => $2)",
                                                     {db::Text(t), db::Int(static_cast<int64_t>(opts_.tombstone_retention.count()))}}));
    rep.rows_deleted += del.Affected();
  }
  return rep;
}

Sweeper::Sweeper(Uploads* uploads, std::chrono::milliseconds interval)
    : uploads_(uploads), thread_(interval, [this] { SweepOnce(); }, /*run_at_start=*/false) {}

void Sweeper::SweepOnce() {
  auto r = uploads_->Sweep();
  if (!r.ok()) {
    log::Warn("upload sweep failed (retried next interval)", {{"error", r.status().ToString()}});
  } else if (r->expired + r->parts_removed + r->objects_removed + r->rows_deleted > 0) {
    log::Info("upload sweep", {{"expired", r->expired},
                               {"parts_removed", r->parts_removed},
                               {"objects_removed", r->objects_removed},
                               {"rows_deleted", r->rows_deleted}});
  }
}

}  // namespace oml::uploads
