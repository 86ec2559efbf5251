// Attachments of a claim (issue 9: "Naming, binding, the signed unit", "Admission lifecycle",
// "Retrieval"; sql/0013_attachments.sql).
//
// Binding. POST /v1/claims names completed uploads (uploads/uploads.h) of the caller's own API
// key. Each is looked up, decrypted from the quarantine bucket (plaintext digest checked against
// the upload's), and reviewed per type (review/review.h). claim.submitted then lists every
// attachment's digests, media type and size (so the claim's signature binds them all), and each
// file gets its own submission.attach event with the same digests plus its review record; all in
// one commit-point transaction. The fold of submission.attach inserts the attachments row, moves
// the upload's wrapped DEK to attachment_keys and deletes the upload session, guarded: an upload
// attached by a racing claim, cancelled or expired in between fails the whole submission.
//
// Naming (docs/data/uploads.md "Naming"): an object is keyed by its CIPHERTEXT digest,
// <tenant>/<ciphertext_sha256 hex>, and every attachment has its own DEK. The seed's name by
// plaintext digest would give two claims with the same file one object under two DEKs; with
// ours they share nothing, so erasing one never makes another's file unreadable. The plaintext
// digest stays the signed identity (submission.attach, claim.submitted).
//
// Lifecycle of the ciphertext:
//   held, rejected   quarantine bucket (until the rejected retention, a follow-up: not swept yet)
//   promoted         copied to the bodies bucket under the same key, byte for byte (the copy's
//                    SHA-256 is checked against the journalled ciphertext digest before the
//                    claim.promoted event; the quarantine copy is deleted after it commits)
//   demoted          stays in the bodies bucket (only readers of promoted claims lose it)
//   erased           attachment_keys row deleted in the artifact.erased transaction (crypto-
//                    shredding: the ciphertext can never be decrypted again), then the object is
//                    deleted from its bucket; an object whose delete failed is unreadable
//                    ciphertext that the reconciler (roadmap) reports by digest.
//
// Serving. Each attachment served to a reviewer or admin while the claim is held journals
// review.served (item = its ordinal; item 0 is the body, served by GET /v1/claims/{id}) unless
// that reviewer was served it before. A verdict (accept or reject) needs every attachment served
// to the reviewer giving it: kFailedPrecondition "attachments-not-served" (409) otherwise.
//
// Thread-safe; every call uses its own connections from the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "admission/claims.h"
#include "blob/object_store.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "journal/journal.h"
#include "review/review.h"
#include "uploads/uploads.h"

namespace oml::admission {

inline constexpr int kMaxAttachments = 16;  // per claim

struct Attachment {
  int ordinal = 0;  // 1.. in the order the claim named them
  std::string upload_id;
  std::string plaintext_sha256, ciphertext_sha256;  // raw, 32 bytes each
  int64_t size = 0, ciphertext_size = 0;
  std::string media_type;  // as declared at upload
  std::string filename;    // "" if none
  std::string object_key;  // <tenant>/<ciphertext_sha256 hex>
  std::string location;    // quarantine | bodies | none
  nlohmann::json review;   // review::ReviewToJson (no text), as signed in submission.attach
  bool flagged = false;    // a deny-list hit or an infection
  int64_t attach_seq = 0;
};

// A completed upload checked and reviewed, ready to be attached.
struct PreparedAttachment {
  Attachment a;
};

// A byte range of an attachment's plaintext, as HTTP states it (RFC 9110 §14.1.2):
// bytes=first-last (inclusive), bytes=first- (last = UINT64_MAX: to the end), or
// bytes=-suffix_length (the last suffix_length bytes; first and last unused).
struct ByteRange {
  uint64_t first = 0;
  uint64_t last = UINT64_MAX;
  uint64_t suffix_length = 0;  // > 0: a suffix range
};

struct ServedAttachment {
  Attachment meta;
  uint64_t first = 0;
  uint64_t length = 0;   // the plaintext of [first, first + length) is served
  bool partial = false;  // a range was asked for (206)
  // The bytes, piece by piece ("" at the end), read from the object store and decrypted as they
  // are asked for: constant memory whatever the file's size. kDataLoss "integrity" if the object
  // fails a tag, ends early, or (a whole read) does not match its digests at its end.
  std::function<Result<std::string>()> next;
  // Takes back a piece `next` returned, once sent, for its memory (http::Response::recycle).
  std::function<void(std::string)> recycle = [](std::string) {};
};

// An inline body kept as an object (sql/0015): bodies whose ciphertext is above
// AttachmentsOptions::inline_body_max_bytes.
struct BodyObject {
  int version = 0;
  std::string location;           // quarantine | bodies | none
  std::string object_key;         // <tenant>/<ciphertext_sha256 hex>
  std::string ciphertext_sha256;  // raw, as journalled in claim.submitted
};

struct AttachmentsOptions {
  // The one placement rule for inline bodies (sql/0015): a body whose ciphertext is at most this
  // many bytes stays in artifact_bodies; a larger one becomes an object with an attachment's
  // lifecycle (quarantine, bodies on promotion, deleted after erasure).
  uint64_t inline_body_max_bytes = 64 * 1024;
};

class Attachments {
 public:
  // REQUIRES: every pointer outlives this object.
  Attachments(db::Pool* pool, journal::Journal* journal, const crypto::KekProvider* kek, uploads::Uploads* uploads,
              blob::ObjectStore* quarantine, blob::ObjectStore* bodies, review::Options review,
              AttachmentsOptions opts = {});

  const review::Options& review_options() const { return review_; }

  // Checks the ids (kInvalidArgument "invalid-field": more than kMaxAttachments, not a uuid, or
  // named twice), looks each up as a completed upload of c's API key (kNotFound
  // "upload-not-found" otherwise), decrypts it from quarantine (kDataLoss "integrity" if the
  // object's bytes or plaintext digest are not the upload's), and reviews it.
  Result<std::vector<PreparedAttachment>> Prepare(const Caller& c, const std::vector<std::string>& upload_ids);

  // claim.submitted's "attachments" member: [{ordinal, plaintext_sha256, ciphertext_sha256
  // (lowercase hex), media_type, size}], in ordinal order.
  static nlohmann::json Binding(const std::vector<PreparedAttachment>& prepared);

  // The submission.attach events (fold included) of a claim version, in ordinal order. They must
  // follow claim.submitted in the same transaction (their fold references the artifacts row).
  std::vector<journal::EventSpec> AttachEvents(const Caller& c, const std::string& artifact_id, int version,
                                               const std::vector<PreparedAttachment>& prepared) const;

  // After the submission committed: deletes any part objects its upload sessions still had
  // (a completed session whose part deletion had failed; its row, which the sweep would have
  // retried from, is gone now). Errors are logged.
  void DropLeftoverParts(const std::string& tenant, const std::vector<PreparedAttachment>& prepared);

  // The attachments of a claim version, by ordinal ([] if none).
  Result<std::vector<Attachment>> List(const std::string& tenant, const std::string& artifact_id, int version);

  // Journals review.served for `item` (0 the body, n the attachment with ordinal n) when c is a
  // reviewer or admin, m is held, and c.principal was not served that item before. No-op
  // otherwise.
  Status RecordServed(const Caller& c, const ClaimMeta& m, int item, const std::string& plaintext_sha256,
                      const std::string& ciphertext_sha256);

  // Attachment `ordinal` of m, for c (who may read m: the caller checked): the whole file or one
  // range, streamed (ServedAttachment::next), of any size. A reviewer's or admin's read of a held
  // claim records the serve (RecordServed) before a byte is returned, after a first pass that
  // decrypted and checked the bytes without keeping them: a whole read serves the file; range
  // reads serve it once they covered [0, size) without a gap (review_progress). A range decrypts
  // from the segment holding its first byte, every segment it touches authenticated; a whole
  // read's digests are checked at its end. kNotFound "attachment-not-found" for an unknown
  // ordinal; kGone "erased" once erased; kInvalidArgument "range-not-satisfiable" (416) for a
  // range past the end.
  Result<ServedAttachment> Serve(const Caller& c, const ClaimMeta& m, int ordinal, std::optional<ByteRange> range);
  // What Serve would answer (the same errors, first, length, partial), reading and journalling
  // nothing: for HEAD. `next` returns "" at once.
  Result<ServedAttachment> Describe(const Caller& c, const ClaimMeta& m, int ordinal, std::optional<ByteRange> range);

  // OK iff c.principal was served every attachment of m (none: OK); else kFailedPrecondition
  // "attachments-not-served" naming the ordinals not served.
  Status CheckAllServed(const Caller& c, const ClaimMeta& m);

  // Promotion, for the search index (admission/recall.h): the extracted text of an attachment
  // whose review extracted text (text, JSON, Markdown, PDF), decrypted from its bucket and
  // extracted again as at submission (review::ExtractTextStream keeps the same first
  // review_max_text_bytes of text as the review did, and reads no further than that needs);
  // nullopt for an opaque one. kDataLoss "integrity" if the object is missing, or, when the read
  // reached the end, its digests do not match (every piece read is authenticated by the AEAD).
  Result<std::optional<std::string>> SearchText(const std::string& tenant, const Attachment& a);

  // Promotion, before claim.promoted is journalled: copies each attachment's ciphertext from
  // quarantine to bodies under the same key, checking the SHA-256 of the bytes copied against
  // the journalled ciphertext digest (kDataLoss "integrity": nothing is promoted). Idempotent.
  Status CopyToBodies(const std::vector<Attachment>& atts);
  // The fold statement of claim.promoted that records the new location.
  static db::Stmt PromoteFold(const std::string& tenant, const std::string& artifact_id, int version);
  // After claim.promoted committed: deletes the quarantine copies (errors are logged; the copy is
  // then unreadable without its key once erased, and the reconciler reports it).
  void DropQuarantineCopies(const std::vector<Attachment>& atts);

  // The fold statements of artifact.erased: delete the keys of every attachment of the artifact
  // (all versions) and set their location to none.
  static std::vector<db::Stmt> EraseFold(const std::string& tenant, const std::string& artifact_id);
  // Every attachment of every version of an artifact (for deleting the objects after erasure).
  Result<std::vector<Attachment>> ListAllVersions(const std::string& tenant, const std::string& artifact_id);
  // After artifact.erased committed: deletes each object from both buckets (whatever the row
  // said: a racing promotion, or a copy a failed or crashed promotion left behind).
  void DeleteObjects(const std::vector<Attachment>& atts);

  // ---- Inline bodies kept as objects (sql/0015) ----
  // True iff a body of `ciphertext_size` bytes of ciphertext is kept as an object.
  bool BodyAsObject(uint64_t ciphertext_size) const { return ciphertext_size > opts_.inline_body_max_bytes; }
  // Before claim.submitted: puts the body's ciphertext into quarantine as <tenant>/<hex digest>
  // (put-if-absent: an object of that name holds these bytes, its name is their digest). Returns
  // the key. An object put for a submission that then fails stays behind as ciphertext no key
  // opens (the reconciler reports it by digest).
  Result<std::string> PutBodyObject(const std::string& tenant, const std::string& ciphertext,
                                    const std::string& ciphertext_sha256);
  // The ciphertext of a body object (kDataLoss "integrity" if it is missing).
  Result<std::string> ReadBodyObject(const std::string& location, const std::string& object_key);
  // A pass over a body object's plaintext, piece by piece (at most 256 KiB of plaintext and its
  // ciphertext in memory): each segment authenticated under `dek` and `aad` as it is decrypted;
  // before the last piece, the object's end, its size (`plaintext_size`) and the plaintext's and
  // ciphertext's SHA-256 are checked (kDataLoss "integrity" instead of that piece). Follows the
  // object into the bodies bucket if a promotion moves it meanwhile. `dek` must outlive the reader.
  Result<std::function<Result<std::string>()>> OpenBodyObject(const std::string& location,
                                                             const std::string& object_key, std::string_view dek,
                                                             const std::string& aad, uint64_t plaintext_size,
                                                             const std::string& plaintext_sha256,
                                                             const std::string& ciphertext_sha256);
  // The body objects of an artifact: every version, or `version` only.
  Result<std::vector<BodyObject>> BodyObjects(const std::string& tenant, const std::string& artifact_id,
                                              std::optional<int> version);
  // Promotion of a body object, as CopyToBodies for attachments (quarantine -> bodies, digest
  // checked), its fold statement (location 'bodies'), and dropping the quarantine copy after.
  Status CopyBodyToBodies(const BodyObject& b);
  static db::Stmt PromoteBodyFold(const std::string& tenant, const std::string& artifact_id, int version);
  void DropQuarantineBody(const BodyObject& b);
  // Erasure: the fold statement (location 'none', every version) and the deletes after commit.
  static db::Stmt EraseBodyFold(const std::string& tenant, const std::string& artifact_id);
  void DeleteBodyObjects(const std::vector<BodyObject>& bodies);

  // The flags of a claim version for its verdict: the body's ("body:<flag>") and each
  // attachment's ("attachment <n>:<flag>"), sorted. Empty if nothing was flagged.
  static nlohmann::json VerdictFlags(const nlohmann::json& body_review, const std::vector<Attachment>& atts);

 private:
  // A reviewer or admin reading a held claim: what review.served records.
  static bool ReviewerOfHeld(const Caller& c, const ClaimMeta& m);
  // Records that [from, to) of `item` was served to c (review_progress.covered, any order);
  // returns the end of the prefix [0, end) the ranges served so far cover without a gap.
  Result<uint64_t> AdvanceProgress(const Caller& c, const ClaimMeta& m, int item, uint64_t from, uint64_t to);
  blob::ObjectStore* StoreOf(const Attachment& a) const;
  blob::ObjectStore* StoreAt(const std::string& location) const;
  void DeleteEverywhere(const std::string& key, const char* what);
  // Deletes `key` from `store`; a failure is logged as "<what> was not deleted" (best effort).
  static void DeleteLogged(blob::ObjectStore& store, const std::string& key, const std::string& what);
  // Copies `key` from quarantine to bodies, checking the bytes' SHA-256 and size.
  Status CopyVerified(const std::string& key, uint64_t size, const std::string& sha256, const std::string& what);
  Result<crypto::SecureBytes> Dek(const std::string& tenant, const Attachment& a);

  db::Pool* pool_;
  journal::Journal* journal_;
  const crypto::KekProvider* kek_;
  uploads::Uploads* uploads_;
  blob::ObjectStore* quarantine_;
  blob::ObjectStore* bodies_;
  review::Options review_;
  AttachmentsOptions opts_;
};

}  // namespace oml::admission
