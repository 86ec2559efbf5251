// Upload sessions: resumable, encrypted-as-they-arrive uploads of attachments (issue 9, tus 1.0
// under /v1/uploads; the protocol is api/uploads_handlers.cc, this module the sessions).
//
// A session (oml.upload_sessions, sql/0011_uploads.sql) belongs to the API key that created it,
// declares the file's size and plaintext SHA-256 up front, and takes chunks at its offset:
//
//   created --PATCH--> receiving --last byte, digest ok--> complete --attached--> (row deleted)
//      |                  |      \--last byte, size/digest wrong--> failed       |
//      |                  \------------------------------------------ DELETE ----+--> cancelled
//      \--------- (all three) expires_at passes (on access or by Sweep) ---------+--> expired
//
// (docs/data/uploads.md draws it.) failed, expired and cancelled are final. An active session
// expires Options::expiry after its creation; a complete one Options::complete_ttl after its
// completion unless a claim attaches it first (admission/attachments.cc moves its DEK out and
// deletes the row, guarded on state = 'complete', in the claim's transaction).
//
// Encryption (docs/data/uploads.md "Naming"): each session gets its own fresh 32-byte DEK at
// creation, wrapped under the KEK (AAD UploadDekAad). Chunks are encrypted as they arrive with
// the segmented AEAD (crypto.h, AAD AttachmentAad); the stream is continued across chunks and
// processes through crypto::AeadEncryptorState. The whole encryptor state (segment size, nonce
// prefix, next segment index, header flag and the plaintext of the trailing partial segment) is
// sealed under the DEK with the committed offset in its AAD (StreamAad; EncodeStreamState), so
// is the running SHA-256 of the plaintext (its state holds plaintext: AAD ShaStateAad). A row
// whose sealed stream does not open under its offset, or whose stream position is not the one
// that offset implies (StreamPositionMatches), is refused as kDataLoss "integrity" before any
// byte is sealed: whoever can write the database but has no DEK cannot rewind the stream into
// nonce reuse. The running SHA-256 of the ciphertext is stored as is. Both hashes go on from
// their stored states after a restart: nothing is re-hashed.
//
// Storage (sessions created since sql/0027, `direct`): each chunk's ciphertext (whole segments)
// goes straight into the session's resumable write (blob::ObjectStore "Resumable writes") at the
// staging key `<tenant>/uploads/<upload_id>/object` BEFORE the row's offset advances: on S3 the
// next part of one multipart upload (its UploadId and every part's ETag recorded in the row with
// the offset, so a resume after kill -9, in any process, continues that same upload), on a local
// store the bytes at their offset in an append-only staging file. S3 parts but the last must hold
// 5 MiB: ciphertext below that is carried in the carry object
// `<tenant>/uploads/<upload_id>/carry-<ciphertext_offset>` (carry_bytes in the row; read back and
// sent with the next chunk, so a carry never exceeds 5 MiB). At the last byte the object's key
// `<tenant>/<ciphertext_sha256_hex>` is first recorded in the row (object_key, still receiving),
// then the carry and the final segment go out as the last part and the write is finished into
// that key (S3: CompleteMultipartUpload, then a server-side CopyObject; local: fsync and rename):
// the last PATCH costs one chunk, whatever the file's size. (A file that never filled a part is
// put whole at the key.) The ciphertext digest is hashed as the bytes go out; nothing re-reads
// them (the reconciler audits every object's digest against its key). The session completes, and
// the carry objects are deleted. Random DEKs and nonce prefixes make ciphertext digests unique,
// so two uploads of one file never share a name or a key.
//
// Sessions created before sql/0027 (not direct) finish the old way: each chunk was a part object
// `<tenant>/uploads/<upload_id>/<part_no, 8 digits>`, composed (blob::ObjectWriter, re-hashed on
// the way: a part changed in the store is kDataLoss) into the object at the last byte.
//
// Mutual exclusion without a transaction during I/O: every act on a session (a chunk, DELETE,
// expiry, the removal of what an ended session left) first takes the session's PostgreSQL
// session-level advisory lock, (0x6f6d6c75 "omlu", hashtext(tenant || '/' || upload_id)), with
// pg_try_advisory_lock on the pooled connection it then uses throughout, and releases it before
// that connection goes back to the pool (if the unlock cannot be confirmed the connection is
// shut down, so the pool drops it; PostgreSQL releases a lost session's locks). The row is read
// after the lock, without a row lock; the encryption and all object-store I/O (part put,
// composition) run outside any transaction, so a PATCH holds no transaction id and no snapshot
// while it waits on the store (the lake writer's outbox cut, docs/data/postgres-schema.md, is
// never held back by an upload); the offset then advances in a short transaction guarded by
// `upload_offset = <the offset read> AND state IN ('created', 'receiving')`, so nothing is ever
// applied twice. (A database connection lost mid-request frees the lock while that request may
// still put a part; its own commit then fails on the dead connection. For a legacy session a part
// it overwrote after a newer request's is caught by the composition's re-hash: kDataLoss. For a
// direct session nothing re-reads the write: bytes it cut off make the next chunk kDataLoss, and
// bytes it overwrote with other ciphertext make an object whose digest is not its name, which the
// reconciler reports (object-digest-mismatch). A row lock was lost the same way.)
//
// Invariants:
//   * The committed offset only moves with a committed part: a chunk is taken whole or not at
//     all (client disconnect, crash, failed put or commit: the offset stays; a part written
//     without its commit is overwritten by the next chunk's part of the same number, or removed
//     with the session). Parts are written before the offset advances.
//   * One act at a time per session: a second PATCH or DELETE finds the advisory lock taken and
//     answers kFailedPrecondition "upload-busy" at once, never waits; the sweep and lazy expiry
//     skip a session whose lock is taken.
//   * A final state holds no key material: failed, expired and cancelled rows lose their wrapped
//     DEK, sealed stream and hash states in the transaction that enters the state (a complete
//     one that is cancelled or expires too: its DEK is shredded), and their parts and object
//     (object_key) are deleted after it commits (parts_left records that something may remain;
//     Sweep retries). A complete row keeps its wrapped DEK (the object needs it).
//   * Crash safety: a crash between a part put and its commit leaves an uncounted part (S3: a part
//     number the retry uploads again; local: bytes past the committed offset, which the retry's
//     write truncates; a carry object the retry puts again); between the object's appearance and
//     the completion's commit, a receiving row whose object_key names the object: the retried
//     last chunk finds it in place (its size) or finishes the write (a completed multipart upload
//     is copied on), and the session's end (DELETE, expiry, digest mismatch) deletes it. A write
//     the store lost (an operator aborted the multipart upload or removed the staging file) is
//     kDataLoss "integrity" (500); the client DELETEs and starts again.
//   * Ended sessions abort their write (S3: AbortMultipartUpload; no incomplete multipart upload
//     is left) when their leftovers are removed.
//   * Memory: one chunk (the request body) and, on a local store, two 256 KiB slices of its
//     ciphertext (slice n+1 is sealed while slice n is written on a thread of the request's; the
//     slices are fsynced once, before the offset moves) plus a pooled 256 KiB bounce buffer for
//     the direct write; on S3 the chunk's whole ciphertext (one part) and up to 5 MiB of carry.
//
// Nonce reuse (crypto.h, AeadStreamEncryptor::Resume): a chunk retried after a crash between
// its part put and its commit is encrypted again from the same state; the same bytes give the
// same ciphertext. A client that sends different bytes for the same offsets gets their segments
// sealed under the same nonces; the part objects are overwritten (same keys), and it is that
// client's own upload under that upload's own DEK. The sealed stream and hash state use a
// fresh random nonce prefix per seal (crypto::EncryptAll).
//
// Thread-safe: every call runs its own transactions on connections from the pool.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "blob/object_store.h"
#include "common/periodic.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "uploads/running_sha256.h"  // RunningSha256, for callers that hash stored objects

namespace oml::uploads {

enum class State { kCreated, kReceiving, kComplete, kFailed, kExpired, kCancelled };
const char* StateName(State s);

// The API key a session belongs to.
struct Owner {
  std::string tenant_id;
  std::string api_key_id;    // "ak_..." (journal::ApiKeyId)
  std::string api_key_hash;  // SHA-256 of the token: writes check the key is not revoked
  std::string principal;     // recorded at creation
};

struct NewUpload {
  uint64_t length = 0;
  std::string plaintext_sha256;  // raw, 32 bytes: the declared digest of the whole file
  std::string filename;          // "" when none was given
  std::string media_type = "application/octet-stream";
  // The Upload-Metadata header as the client sent it (tus creation: HEAD returns it unchanged);
  // "" when not kept. At most kMaxMetadataBytes.
  std::string metadata;
};
inline constexpr size_t kMaxMetadataBytes = 8192;

enum class ChecksumAlgorithm { kSha1, kSha256 };
struct Checksum {
  ChecksumAlgorithm algorithm = ChecksumAlgorithm::kSha256;
  std::string digest;  // raw
};

// A session as its owner sees it.
struct Session {
  std::string upload_id;
  State state = State::kCreated;
  uint64_t length = 0;
  uint64_t offset = 0;
  int64_t expires_at = 0;  // Unix seconds
  std::string declared_sha256;  // raw
  std::string filename;
  std::string media_type;
  std::string metadata;  // NewUpload::metadata ("" for a session created before sql/0021)
};

// A completed upload, for the claim that attaches it (admission): everything needed to name,
// verify and decrypt its object.
struct CompletedUpload {
  std::string upload_id;
  std::string tenant_id;
  std::string api_key_id;
  std::string principal;
  uint64_t size = 0;                 // plaintext bytes
  std::string plaintext_sha256;      // raw, 32 bytes (= the declared digest)
  std::string ciphertext_sha256;     // raw, 32 bytes
  uint64_t ciphertext_size = 0;
  std::string media_type;
  std::string filename;              // "" when none was given
  std::string object_key;            // `<tenant>/<ciphertext_sha256_hex>` in the quarantine bucket
  std::string wrapped_dek;           // 60 bytes, AAD UploadDekAad(tenant, upload_id)
  std::string kek_id;                // the KEK that wrapped it
  int64_t completed_at = 0;          // Unix seconds
};

// AAD of a session's wrapped DEK: "oml-upload-dek|<tenant>|<upload_id>" (also the KEK rotation's,
// admission/kek_rotation.h).
std::string UploadDekAad(const std::string& tenant, const std::string& upload_id);
// AAD of the attachment's ciphertext (every segment): "oml-attachment|<tenant>|<upload_id>".
std::string AttachmentAad(const std::string& tenant, const std::string& upload_id);
// AADs of the sealed stream state and plaintext-hash state at a committed offset:
// "oml-upload-stream|<tenant>|<upload_id>|<offset>", "oml-upload-sha|<tenant>|<upload_id>|<offset>".
std::string StreamAad(const std::string& tenant, const std::string& upload_id, uint64_t offset);
std::string ShaStateAad(const std::string& tenant, const std::string& upload_id, uint64_t offset);

// The plaintext of stream_sealed (crypto::EncryptAll under the DEK, AAD StreamAad): version 0x01,
// segment_size (u32 BE), nonce_prefix (7 bytes), next_segment (u64 BE), header_sent (0x00/0x01),
// then the pending plaintext (0..segment_size bytes). It holds plaintext: wipe it after use.
std::string EncodeStreamState(const crypto::AeadEncryptorState& st);
// kDataLoss "integrity" for bytes that are not such a state.
Result<crypto::AeadEncryptorState> DecodeStreamState(std::string_view bytes);
// True iff `st` is where a stream stands after exactly `offset` plaintext bytes: offset 0: no
// header, no segment, nothing pending; else the header sent, next_segment = (offset - 1) /
// segment_size and the rest (1..segment_size bytes) pending (crypto.cc seals a full segment only
// once a byte follows it).
bool StreamPositionMatches(const crypto::AeadEncryptorState& st, uint64_t offset);
// Object keys in the quarantine bucket.
std::string PartPrefix(const std::string& tenant, const std::string& upload_id);  // ".../" form
std::string PartKey(const std::string& tenant, const std::string& upload_id, int64_t part_no);  // legacy sessions
// A direct session's resumable write (".../object") and its carry object at a ciphertext offset
// (".../carry-<16 digits>").
std::string StagingKey(const std::string& tenant, const std::string& upload_id);
std::string CarryKey(const std::string& tenant, const std::string& upload_id, uint64_t ciphertext_offset);
std::string ObjectKey(const std::string& tenant, const std::string& ciphertext_sha256_raw);

struct Options {
  uint64_t max_length = uint64_t{8} << 30;      // largest declared size (Tus-Max-Size)
  std::chrono::seconds expiry{86400};            // a session's life from creation
  // A complete session's life from its completion: unless a claim attaches it by then, it
  // expires (DEK shredded, object deleted). Config upload_complete_ttl_s.
  std::chrono::seconds complete_ttl{86400};
  // How long a failed, expired or cancelled session's key-less row stays (its 410/404 answers)
  // before Sweep deletes it.
  std::chrono::seconds tombstone_retention{86400};
  uint32_t segment_size = crypto::kDefaultSegmentSize;
  // Quotas on open sessions (created or receiving, not past expires_at), checked by Create under
  // a per-tenant lock so that concurrent creations cannot overshoot: how many the creating key
  // and its tenant may hold, and their pending bytes (declared length minus offset, the new
  // session's length included). 0: no limit. Over one: kFailedPrecondition "upload-quota-exceeded"
  // (429), nothing created. The server's defaults come from the config (common/config.h).
  int64_t max_sessions_per_key = 0;
  int64_t max_sessions_per_tenant = 0;
  uint64_t max_pending_bytes_per_key = 0;
  uint64_t max_pending_bytes_per_tenant = 0;
  // A non-empty chunk that does not reach the declared length must hold at least this many
  // bytes (kInvalidArgument "upload-chunk-too-small", 400): each chunk costs a commit and its
  // WAL, whatever its size. 0: any size.
  uint64_t min_chunk_bytes = 0;
};

struct SweepReport {
  int64_t expired = 0;         // sessions moved to expired
  int64_t parts_removed = 0;   // part objects and carries deleted, resumable writes aborted
  int64_t objects_removed = 0; // composed objects of ended sessions deleted
  int64_t rows_deleted = 0;    // tombstones deleted
};

// Errors (problem slugs; HTTP status in parentheses, api/server.cc HttpStatus):
//   kNotFound "upload-not-found" (404)       no such session for this key: unknown, another key's
//                                            or tenant's, malformed id, or cancelled
//   kGone "upload-expired" (410)             expired (its data is removed)
//   kGone "upload-failed" (410)              failed at its last byte (its data is removed)
//   kFailedPrecondition "upload-offset-mismatch" (409)  Upload-Offset is not the session's offset
//   kFailedPrecondition "upload-busy" (409)  another request holds the session (a chunk, DELETE)
//   kPayloadTooLarge "upload-too-large" (413)  a declared length above Options::max_length, or above
//                                            a pending-bytes quota (it could never fit)
//   kPayloadTooLarge "upload-length-exceeded" (413)  a chunk past the declared length
//   kInvalidArgument "checksum-mismatch" (460)  the chunk does not match its Upload-Checksum
//   kInvalidArgument "digest-mismatch" (422)  the whole file's SHA-256 is not the declared one
//   kInvalidArgument "invalid-upload-metadata" (400)
//   kInvalidArgument "upload-chunk-too-small" (400)  a non-final chunk under Options::min_chunk_bytes
//   kFailedPrecondition "upload-quota-exceeded" (429)  Create over a quota (Options)
//   kPermissionDenied "forbidden-role" (403)  a reviewer creating an upload
//   kUnauthenticated "unauthenticated" (401)  the key was revoked (checked by every write)
//   kDataLoss "integrity" (500)              stored state, a part or the wrapped DEK is not what
//                                            this server wrote (a sealed stream state that does not
//                                            open under the row's offset, or whose position is not
//                                            that offset's)
// and the database's and the object store's own errors (db/conn.h, blob/object_store.h).
class Uploads {
 public:
  // REQUIRES: every pointer outlives this object; `quarantine` is thread-safe.
  Uploads(db::Pool* pool, const crypto::KekProvider* kek, blob::ObjectStore* quarantine, Options opts);

  const Options& options() const { return opts_; }

  // Creates a session (state created, offset 0, expires now + expiry). `role` is the caller's:
  // reviewers may not upload. A zero-length upload completes at once (or fails: digest-mismatch).
  Result<Session> Create(const Owner& owner, const std::string& role, const NewUpload& req);

  // The session (no lock). A session past expires_at (active or complete) is expired here (kGone).
  Result<Session> Head(const Owner& owner, const std::string& upload_id);

  // Appends `bytes` at `offset` (tus PATCH). Checks, in order: the key is live (401), the
  // session (404/410), the lock (409 upload-busy), expiry (410), the offset (409
  // upload-offset-mismatch), the length (413), the chunk's minimum size (400
  // upload-chunk-too-small), the checksum (460); then opens the sealed state
  // (500 integrity), encrypts, puts the part (no transaction open), and commits the new offset
  // in a short guarded transaction. At the last byte: the plaintext digest (422 digest-mismatch:
  // the session fails, every part is deleted), then the object's key is recorded, the object
  // composed, and the session completes. An empty chunk at the current offset changes nothing.
  // A complete session answers an empty chunk at its length with the session.
  // *current_offset is set to the session's committed offset whenever the row was read (for the
  // Upload-Offset of a 409).
  Result<Session> Append(const Owner& owner, const std::string& upload_id, uint64_t offset, std::string_view bytes,
                         const std::optional<Checksum>& checksum, uint64_t* current_offset = nullptr);

  // tus termination: an active or complete session becomes cancelled; its DEK is shredded and
  // its parts and object (a complete one's, or one composed before a crash) are deleted. 404
  // for a cancelled one (or one a claim attached meanwhile), 410 for failed or expired (or past
  // expires_at: it expires instead), 409 upload-busy while another request holds it.
  Status Cancel(const Owner& owner, const std::string& upload_id);

  // The completed session `upload_id` of `owner`'s key (tenant and API key id; the hash and
  // principal are not used). kNotFound "upload-not-found" if there is none for that key, or it
  // is not complete or past its expires_at (the message says which state).
  Result<CompletedUpload> LookupCompleted(const Owner& owner, const std::string& upload_id);
  // The same inside a caller's open transaction, already scoped to owner.tenant_id (e.g. the
  // claim's commit-point transaction). `lock`: FOR SHARE, so that it cannot change until commit.
  Result<CompletedUpload> LookupCompleted(db::Conn& tx, const Owner& owner, const std::string& upload_id, bool lock);

  // Expires overdue sessions (active ones past their expiry, complete ones past complete_ttl),
  // deletes the parts and objects ended sessions left, and deletes tombstones older than
  // tombstone_retention, in every tenant. A session whose lock is held is skipped (next sweep).
  // Idempotent.
  Result<SweepReport> Sweep();

 private:
  struct Row;
  class SessionLock;
  // Takes the session's lock and reads its row (for this owner's key; any key when
  // owner.api_key_id is empty), in one round trip; `live_key`: the key must not be revoked.
  // nullopt: no such row.
  Result<std::optional<Row>> LockAndRead(db::Conn& c, SessionLock& lock, const Owner& owner, const std::string& upload_id,
                                         bool live_key);
  // Takes the chunk. REQUIRES: c holds the session's lock and no transaction; the row is active,
  // at `offset`, and the chunk fits.
  Result<Session> DoAppend(db::Conn& c, const Owner& owner, Row& row, uint64_t offset, std::string_view bytes);
  // Puts the session in final state `to` without key material, in its own transaction: from an
  // active state, or (to expired or cancelled) from complete; `only_overdue`: only if past
  // expires_at. False if the row was not in such a state (gone, attached, ended).
  // REQUIRES: c holds the session's lock.
  Result<bool> EndSession(db::Conn& c, const std::string& tenant, const std::string& upload_id, State to,
                          bool only_overdue);
  // Takes the lock of an overdue session and expires it (and removes what it left); false if
  // its lock is held or it is not overdue.
  Result<bool> ExpireIfOverdue(db::Conn& c, const std::string& tenant, const std::string& upload_id,
                               SweepReport* counts = nullptr);
  // What a session that is not active left in the bucket: every object under its part prefix,
  // and, for failed, expired or cancelled, the object its object_key names; then clears
  // parts_left (and object_key). Nothing for an active session. REQUIRES: c holds the lock.
  Status RemoveLeftovers(db::Conn& c, const std::string& tenant, const std::string& upload_id,
                         SweepReport* counts = nullptr);
  // RemoveLeftovers; a failure is logged (parts_left stays set: the sweep retries).
  void RemoveLeftoversOrLog(db::Conn& c, const std::string& tenant, const std::string& upload_id,
                            SweepReport* counts = nullptr);

  db::Pool* pool_;
  const crypto::KekProvider* kek_;
  blob::ObjectStore* store_;
  Options opts_;
};

// Runs Uploads::Sweep every `interval` on its own thread until destroyed (errors are logged).
class Sweeper {
 public:
  Sweeper(Uploads* uploads, std::chrono::milliseconds interval);

 private:
  void SweepOnce();
  Uploads* uploads_;
  PeriodicThread thread_;  // last: runs SweepOnce
};

}  // namespace oml::uploads
