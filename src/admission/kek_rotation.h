// KEK rotation (`oml kek rotate`): re-wraps every stored DEK under a new KEK.
//
// Each row of oml.artifact_keys holds one DEK wrapped under the KEK its kek_id names
// (sql/0006_kek_id.sql); so does each upload session that still has a DEK (oml.upload_sessions,
// sql/0011: active and complete sessions, AAD uploads::UploadDekAad). RotateKek walks every
// tenant's rows of each table in id order, in batches; each batch is one transaction scoped to
// the tenant (shown for artifact_keys; upload_sessions by upload_id alike):
//
//   BEGIN; scope; SELECT ... WHERE kek_id <> <new id> AND artifact_id > <cursor>
//                        ORDER BY artifact_id LIMIT <batch> FOR UPDATE
//   (client)     unwrap each DEK under the KEK its row names, wrap it under the new KEK
//   UPDATE ... SET kek_id = <new id>, wrapped_dek = <new wrap> WHERE ... AND kek_id = <old id>
//   COMMIT
//   sync point "kek.rotate.after_batch" (tests fail the run here to interrupt it)
//
// Invariants:
//   * At every instant each DEK is wrapped under exactly one KEK, and its row names it: the UPDATE
//     writes both columns together. A run interrupted anywhere leaves rows under the old and the
//     new KEK; readers that hold both (crypto::KekRing, the server's previous_kek_file) read all of
//     them, and a re-run re-wraps the rest (it is idempotent).
//   * Erased DEKs stay destroyed: the rotation only UPDATEs rows it locked, never inserts; an
//     erasure racing a batch waits for the batch's row lock and then deletes the re-wrapped row.
//   * Unwrapped DEKs live in crypto::SecureBytes and are wiped as soon as they are re-wrapped.
//   * One rotation at a time: a run holds a session advisory lock; a second run fails with
//     kFailedPrecondition "kek-rotation-running".
//
// Completion: when no row is left under another KEK, the run journals `kek.rotated` on the provider
// chain (docs/data/event-catalog.md), unless it re-wrapped nothing and the latest kek.rotated
// already names the new KEK (a repeated run appends nothing). Rows under a KEK the run does not
// hold are skipped and fail the run with kFailedPrecondition "kek-unavailable" (no event); rows
// written under another KEK while the run went on (a server still configured with the old KEK as
// kek_file) fail it with kFailedPrecondition "kek-rotation-incomplete" (no event; re-run).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/status.h"
#include "crypto/crypto.h"
#include "journal/journal.h"

namespace oml::admission {

struct KekRotationOptions {
  int batch_size = 500;  // rows per transaction, >= 1
};

struct KekRotationReport {
  std::string kek_id;                              // the new KEK's id
  std::map<std::string, int64_t> rewrapped_from;   // old kek_id -> DEKs this run re-wrapped
  int64_t rewrapped = 0;                           // sum of rewrapped_from
  int64_t keys = 0;                                // DEKs under the new KEK at completion
  int64_t batches = 0;                             // committed batch transactions
  std::optional<journal::Receipt> receipt;         // of kek.rotated; empty if nothing was appended
};

// Re-wraps every DEK not yet recorded under target.kek_id() (see above). `sources` unwraps the
// DEKs under the old KEK(s); `target` also unwraps rows recorded under an id it Holds() (e.g. its
// legacy id), which are re-recorded under target.kek_id(). The event is signed by journal.key().
Result<KekRotationReport> RotateKek(journal::Journal& journal, const crypto::KekProvider& target,
                                    const crypto::KekProvider& sources, const KekRotationOptions& opts);

}  // namespace oml::admission
