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
#pragma once

#include <optional>
#include <string>

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
  std::optional<std::string> simulation_id;
  std::string media_type = "text/plain";
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
};

struct SubmitResult {
  ClaimMeta meta;
  journal::Receipt receipt;
};

struct FetchResult {
  ClaimMeta meta;
  std::string body;
};

class Claims {
 public:
  Claims(journal::Journal* journal, db::Pool* pool, const crypto::KekProvider* kek, uint64_t max_body_bytes)
      : journal_(journal), pool_(pool), kek_(kek), max_body_(max_body_bytes) {}

  // kInvalidArgument on bad fields, kPayloadTooLarge over the limit, kPermissionDenied for a
  // role that may not write (reviewers only review).
  Result<SubmitResult> Submit(const Caller& c, const SubmitRequest& req);
  // kNotFound for unknown ids, other tenants' ids, and held claims the caller may not see
  // (own-work rule: only the author, reviewers and admins read a held claim). kGone if erased.
  Result<FetchResult> Fetch(const Caller& c, const std::string& artifact_id);
  // Erases an artifact (all versions). Allowed for admins and the author. kGone if already erased.
  Result<std::pair<ClaimMeta, journal::Receipt>> Erase(const Caller& c, const std::string& artifact_id,
                                                       const std::string& reason);

  static bool ValidUuid(const std::string& s);

 private:
  Result<std::optional<ClaimMeta>> Load(db::Conn& conn, const std::string& tenant, const std::string& artifact_id);
  journal::Journal* journal_;
  db::Pool* pool_;
  const crypto::KekProvider* kek_;
  uint64_t max_body_;
};

}  // namespace oml::admission
