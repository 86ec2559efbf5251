// Claims: submission (held), fetch, erasure. Built on the commit point; every act is journalled.
//
// Submission encrypts the body under a fresh per-artifact DEK (segmented AES-256-GCM, AAD
// "oml-body|<tenant>|<artifact_id>|<version>"), wraps the DEK under the KEK (AAD
// "oml-dek|<tenant>|<artifact_id>"), computes both digests, and journals claim.submitted with
// digests and metadata only. Fold: artifacts row (state "held"), artifact_bodies (ciphertext),
// artifact_keys (wrapped DEK) — all in the commit-point transaction.
//
// Fetch checks the ciphertext digest, unwraps, decrypts and checks the plaintext digest before
// returning a body; a mismatch is kDataLoss type "integrity" and no body is returned.
// Erasure deletes the artifact_keys row (crypto-shredding) and journals artifact.erased; fetch
// then answers kGone with the erasure seq.
//
// Review (sql/0009): a reviewer's or admin's verdict on a held claim journals claim.promoted
// (accept) or claim.rejected (reject); a promoted claim can be demoted (claim.demoted). Each act's
// fold moves the state with an UPDATE guarded by the state it starts from, so of two racing acts
// exactly one is journalled. Promotion, demotion and the erasure of a claim that was ever promoted
// also enqueue silver/claims outbox rows in the same transaction (oml.enqueue_silver_claims).
//
// Idempotent writes (SubmitOnce, EraseOnce, ReviewOnce; table oml.idempotency_keys, sql/0005): the first
// write with an Idempotency-Key records, as fold statements of its own event (so in the same
// transaction), the response it answers. A retry with the same key and the same request gets that
// response back, with the receipt re-read from the journal row, instead of a second event.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/periodic.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "journal/journal.h"

namespace oml::admission {

// Who is calling: resolved from the API key.
struct Caller {
  std::string tenant_id;
  std::string principal;
  std::string role;        // writer | reviewer | admin
  std::string api_key_id;  // "ak_..."; "cli" for the operator
  // SHA-256 of the caller's token; empty for the operator. Writes pass it on as
  // EventSpec::api_key_hash: a write racing the key's revocation fails with 401.
  std::string api_key_hash;
};

struct SubmitRequest {
  std::string body;
  std::string workarea_id;
  std::string path;
  std::string provenance;  // human | agent | tool | import
  // A running simulation of the tenant (admission/lifecycle.h); else the submission is refused
  // with kFailedPrecondition "simulation-not-running" (409), checked after CheckSubmit's checks
  // and again in the claim.submitted transaction.
  std::optional<std::string> simulation_id;
  std::string media_type = "text/plain";
  // Ids of completed uploads of the caller's API key (uploads/uploads.h), attached in this order
  // (admission/attachments.h). Empty: no attachments.
  std::vector<std::string> attachments;
};

struct ClaimMeta {
  std::string artifact_id;
  int version = 1;
  std::string workarea_id, path, principal, writer_key_id, provenance, media_type, state;
  std::optional<std::string> simulation_id;
  int64_t size = 0;
  std::string plaintext_sha256, ciphertext_sha256;  // raw
  int64_t submitted_seq = 0;
  std::optional<int64_t> erased_seq;
  // Seqs of the review events (sql/0009); promoted_seq stays set after demotion and erasure.
  std::optional<int64_t> promoted_seq, rejected_seq, demoted_seq;
  // The deny-list gate's record of the body (sql/0013 artifacts.body_review; as signed in
  // claim.submitted "review"); null for claims submitted without the gate.
  nlohmann::json body_review;
};

// A review act on a claim's newest version. Each is one event type, allowed from one state:
//   act      event           from      to        seq column     wrong state (409)    silver row
//   kAccept  claim.promoted  held      promoted  promoted_seq   claim-not-held       yes
//   kReject  claim.rejected  held      rejected  rejected_seq   claim-not-held       no
//   kDemote  claim.demoted   promoted  demoted   demoted_seq    claim-not-promoted   yes
enum class ReviewAct { kAccept, kReject, kDemote };

// "accept" -> kAccept, "reject" -> kReject; anything else kInvalidArgument "invalid-field".
Result<ReviewAct> ParseVerdict(const std::string& verdict);

struct SubmitResult {
  ClaimMeta meta;
  journal::Receipt receipt;
};

struct FetchResult {
  ClaimMeta meta;
  std::string body;
};

// Reads a body piece by piece: each call returns the next bytes, "" at the end.
using PieceReader = std::function<Result<std::string>()>;

// A claim whose body may be read piece by piece (Claims::FetchStreamed). `streamed` false: the
// body is in `body` (a small one, kept in PostgreSQL). `streamed` true: a body kept as an object
// (sql/0015); each call of `open` starts a new pass over its plaintext (Attachments::OpenBodyObject:
// every segment authenticated, the size and plaintext digest checked before the last piece, so a
// damaged object ends a pass with kDataLoss "integrity" instead of its last piece).
struct StreamedFetch {
  ClaimMeta meta;
  bool streamed = false;
  std::string body;
  std::function<Result<PieceReader>()> open;
};

// An Idempotency-Key sent with a write (IETF httpapi draft "The Idempotency-Key HTTP Header
// Field"). Keys are scoped to the caller's API key: the same key from two API keys is two keys.
struct IdempotencyKey {
  std::string key;             // 1..255 printable ASCII (CheckIdempotencyKey)
  std::string request_sha256;  // raw, 32 bytes: the transport's fingerprint of the whole request
  int64_t ttl_s = 86400;       // honoured for this long after the recording write began (>= 1)
};

// A write's answer as the transport sends it.
struct WriteResponse {
  int status = 0;
  nlohmann::json body;  // the rendered document (RenderResponse) plus "receipt"
  journal::Receipt receipt;
  bool replayed = false;  // the recorded answer to an earlier request with the same key; no new event
};

// Renders a committed write's response (status, document WITHOUT "receipt") from its final
// metadata (submitted_seq / erased_seq set). It runs inside the commit-point transaction, maybe
// more than once (a failed group is retried event by event) and on another thread (the group
// leader's): it must be deterministic and thread-safe. Its output is recorded and replayed.
using RenderResponse = std::function<std::pair<int, nlohmann::json>(const ClaimMeta&)>;

// The AAD that binds a wrapped DEK to its owner: "oml-dek|<tenant>|<artifact_id>" (also used by
// the KEK rotation, admission/kek_rotation.h, which re-wraps under the same AAD).
std::string DekAad(const std::string& tenant, const std::string& artifact_id);

class Attachments;  // admission/attachments.h

class Claims {
 public:
  struct IndexReport {
    int indexed = 0;  // versions whose text is in claim_text now
    int dropped = 0;  // versions no longer promoted (or gone): taken off the queue, not indexed
    int failed = 0;   // versions whose text could not be read: still queued, tried again later
  };

  Claims(journal::Journal* journal, db::Pool* pool, const crypto::KekProvider* kek, uint64_t max_body_bytes)
      : journal_(journal), pool_(pool), kek_(kek), max_body_(max_body_bytes) {}

  // Checks, in order (CheckSubmit): kPermissionDenied "forbidden-role" for a role that may not
  // write (reviewers only review), kPayloadTooLarge "body-too-large" over the limit,
  // kInvalidArgument "invalid-field" for a body that is not UTF-8 or a metadata field that
  // breaks its rule in fields/fields.h. Nothing is written when a check fails.
  Result<SubmitResult> Submit(const Caller& c, const SubmitRequest& req);
  // kNotFound for unknown ids, other tenants' ids, and held claims the caller may not see
  // (own-work rule: only the author, reviewers and admins read a held claim). kGone if erased.
  Result<FetchResult> Fetch(const Caller& c, const std::string& artifact_id);
  // Fetch for a body of any size in constant memory: the same checks and errors, but a body kept
  // as an object is not read here (StreamedFetch::open reads it, in pieces, as often as needed).
  Result<StreamedFetch> FetchStreamed(const Caller& c, const std::string& artifact_id);
  // Erases an artifact (all versions). Allowed for admins and the author. kGone if already erased.
  // kInvalidArgument "invalid-field" (first, before the claim is looked up) if `reason` breaks
  // CheckReason (fields/fields.h): more than 1024 characters, a control character, not UTF-8.
  Result<std::pair<ClaimMeta, journal::Receipt>> Erase(const Caller& c, const std::string& artifact_id,
                                                       const std::string& reason);

  // Submit / Erase at most once per (c.api_key_hash, idem.key) while its record lives. First the
  // request's own checks (Submit's, or Erase's reason check) as above; then the key is looked
  // up, and a live record answers instead of writing:
  //   same request_sha256   its response, replayed = true, body byte-identical to the first
  //                         answer (receipt re-read from the journal row at the recorded seq);
  //   another fingerprint   kInvalidArgument "idempotency-key-reused" (HTTP 422), nothing written.
  // Otherwise writes, recording render(meta) in the event's transaction. If the write fails (a
  // concurrent request with the key committed first: its record fails ours on the primary key,
  // and the failed transaction leaves nothing), the key is looked up again and a record found
  // answers as above. A primary-key failure without a visible live record (it expired in
  // between) is kFailedPrecondition "idempotency-key-in-flight" (409, retry); any other failure
  // is returned as is.
  // kInvalidArgument "invalid-idempotency-key" for a malformed key or a caller without an API key
  // (the operator). REQUIRES: idem.request_sha256 is 32 bytes, idem.ttl_s >= 1.
  // A review act (ReviewAct above) on the newest version of a claim. Checks, in order:
  // kInvalidArgument "invalid-field" if `reason` breaks CheckReason (as Erase); kPermissionDenied
  // "forbidden-role" unless c.role is reviewer or admin; kNotFound "claim-not-found" for a
  // malformed, unknown or other tenant's id; kGone "erased" for an erased claim; kFailedPrecondition
  // "claim-not-held" / "claim-not-promoted" when the claim is not in the act's starting state (the
  // message names its state). The state is checked again by the fold, in the event's transaction:
  // an act that loses a race to another act on the same claim journals nothing and answers as if
  // it had come second (409 naming the new state, or 410 if it was erased).
  // Payload (digest-only, never a body): artifact_id, version, workarea_id, plaintext_sha256,
  // ciphertext_sha256 (lowercase hex), reason ("" if none), and verdict ("accept" | "reject") for
  // kAccept / kReject.
  // kAccept also queues the version for the search index (sql/0028; IndexSearchQueue builds it
  // after the commit): it reads the body as Fetch does first, so Fetch's kDataLoss "integrity"
  // or kUnavailable "kek-unavailable" refuse the promotion, and nothing is journalled.
  Result<std::pair<ClaimMeta, journal::Receipt>> Review(const Caller& c, const std::string& artifact_id, ReviewAct act,
                                                        const std::string& reason);

  Result<WriteResponse> SubmitOnce(const Caller& c, const SubmitRequest& req, const IdempotencyKey& idem,
                                   const RenderResponse& render);
  Result<WriteResponse> EraseOnce(const Caller& c, const std::string& artifact_id, const std::string& reason,
                                  const IdempotencyKey& idem, const RenderResponse& render);
  // Review at most once per key, as above (the reason check comes before the key is looked up).
  Result<WriteResponse> ReviewOnce(const Caller& c, const std::string& artifact_id, ReviewAct act,
                                   const std::string& reason, const IdempotencyKey& idem, const RenderResponse& render);

  // Attachments and the review gate (admission/attachments.h; not owned, may be null: then a
  // submission naming attachments is refused with kFailedPrecondition "attachments-unavailable"
  // and bodies are not gated). With it:
  //   Submit    gates the body with the deny-list (claim.submitted "review") and attaches
  //             req.attachments (claim.submitted "attachments" + one submission.attach each, in
  //             one transaction);
  //   Review    accept/reject need every attachment served to the reviewer (409
  //             "attachments-not-served") and record the claim's flags ("flags"); accept copies
  //             the attachments to the bodies bucket first and drops the quarantine copies after;
  //   Erase     destroys the attachments' keys with the artifact's and then deletes the objects.
  void set_attachments(Attachments* a) { attachments_ = a; }
  Attachments* attachments() const { return attachments_; }

  // The search index after promotions (sql/0028_search_queue.sql): builds the claim_text rows of
  // at most `max_items` queued versions, every tenant (each a share of the round), oldest
  // promotion first. A version is leased first (not_before moves 5 minutes ahead: another server
  // skips it). Its text (the body as Fetch reads it, and each text attachment's kept text,
  // Attachments::SearchText; a file that does not read back as reviewed, kDataLoss, is left out
  // and logged) is read outside any transaction; then one transaction takes the queue row,
  // inserts the text, and last locks the artifact row FOR SHARE and commits only if the version
  // is still promoted (a version demoted, rejected, erased or superseded first is taken off the
  // queue, nothing indexed). A version whose text cannot be read stays queued: attempts + 1,
  // last_error, retried after 2^attempts seconds (at most 600). Stops between versions once
  // *stop is true. Errors: reading the queue's, or recording a failure's.
  Result<IndexReport> IndexSearchQueue(int max_items = 100, const std::atomic<bool>* stop = nullptr);

  static bool ValidUuid(const std::string& s);
  // The claim's newest version, read in its own short transaction; kNotFound if none. No
  // visibility check: the caller applies the own-work rule (admission/lifecycle.cc does).
  Result<ClaimMeta> LoadNewest(const Caller& c, const std::string& artifact_id);
  // OK iff `key` is 1..255 characters of printable ASCII (0x20..0x7E); else kInvalidArgument
  // "invalid-idempotency-key". The table's CHECK says the same.
  static Status CheckIdempotencyKey(const std::string& key);

 private:
  // Extra fold statements for a write's event, given its final metadata and seq.
  using ExtraFold = std::function<std::vector<db::Stmt>(const ClaimMeta& at_seq, int64_t seq)>;
  using Write = std::function<Result<std::pair<ClaimMeta, journal::Receipt>>(const ExtraFold&)>;
  Status CheckSubmit(const Caller& c, const SubmitRequest& req) const;
  // REQUIRES: CheckSubmit(c, req) is OK.
  Result<SubmitResult> DoSubmit(const Caller& c, const SubmitRequest& req, const ExtraFold* extra);
  // REQUIRES: CheckReason(reason) is OK.
  Result<std::pair<ClaimMeta, journal::Receipt>> DoErase(const Caller& c, const std::string& artifact_id,
                                                         const std::string& reason, const ExtraFold* extra);
  // REQUIRES: CheckReason(reason) is OK.
  Result<std::pair<ClaimMeta, journal::Receipt>> DoReview(const Caller& c, const std::string& artifact_id, ReviewAct act,
                                                          const std::string& reason, const ExtraFold* extra);
  Result<WriteResponse> Once(const Caller& c, const IdempotencyKey& idem, const RenderResponse& render,
                             const Write& write);
  // The live record of (c.api_key_hash, idem.key) as a replayed response; nullopt if none.
  // kInvalidArgument "idempotency-key-reused" if it was recorded for another request.
  Result<std::optional<WriteResponse>> Recorded(const Caller& c, const IdempotencyKey& idem);
  Result<std::optional<ClaimMeta>> Load(db::Conn& conn, const std::string& tenant, const std::string& artifact_id);
  // The claim as `c` may read it (Fetch's errors but the digest checks), where its body's
  // ciphertext is, and its DEK.
  struct BodyAt;
  Result<BodyAt> LocateBody(const Caller& c, const std::string& artifact_id);
  // The body `at` locates, read whole, its ciphertext and plaintext checked against the digests.
  Result<FetchResult> DecryptWhole(const Caller& c, const std::string& artifact_id, BodyAt at);
  // One queued version (IndexSearchQueue); counts it in *rep unless it returns an error.
  Status IndexOne(const std::string& tenant, const std::string& artifact_id, int version, IndexReport* rep);
  journal::Journal* journal_;
  db::Pool* pool_;
  const crypto::KekProvider* kek_;
  uint64_t max_body_;
  Attachments* attachments_ = nullptr;
};

// Runs Claims::IndexSearchQueue at start and then every `interval` on its own thread until
// destroyed, draining what is due each time (errors are logged). `oml serve` runs one.
class SearchIndexer {
 public:
  SearchIndexer(Claims* claims, std::chrono::milliseconds interval);
  ~SearchIndexer();  // ends a round in progress at its next version

 private:
  void IndexOnce();
  Claims* claims_;
  std::atomic<bool> stop_{false};
  PeriodicThread thread_;  // last: runs IndexOnce
};

}  // namespace oml::admission
