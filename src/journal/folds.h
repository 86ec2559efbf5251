// Fold verification (`oml verify --folds`): recomputes the fold tables from the journal and
// reports every row that differs.
//
// The chain pass (verify.h) proves the journal is what the signing keys signed. Reads, though,
// decide from the fold tables: fetch takes `artifacts.principal` and `state` to apply the
// own-work rule, `authenticate()` takes `api_keys`. Nothing guards those tables the way the
// journal guard trigger guards the journal, so whoever can write to the database can promote a
// held claim, re-own it, or plant an API key without touching the chain. This pass replays every
// chain (provider first, then every tenant that a tenant.created event names) and compares:
//
//   table            key                        columns compared           defined by
//   ---------------  -------------------------  -------------------------  ------------------------------
//   tenants          tenant_id                  name, created_seq          tenant.created (provider row:
//                                                                          init)
//   signing_keys     key_id                     public_key, issued_seq,    key.issued; retired by the
//                                               retired_at (NULL or not)   next key.issued (its
//                                                                          `supersedes`)
//   api_keys         ak_ + 16 hex of key_hash   principal, role,           api_key.created,
//                                               created_seq, revoked_seq,  api_key.revoked
//                                               revoked_at (NULL or not)
//   artifacts        (artifact_id, version)     the columns events define  claim.submitted (body_review:
//                                               (every one but tenant_id,  its `review` as signed, NULL
//                                               created_at and             without one), claim.promoted,
//                                               submitted_at)              claim.rejected, claim.demoted,
//                                                                          artifact.erased,
//                                                                          claim.reassigned (workarea_id,
//                                                                          reassigned_seq),
//                                                                          simulation.ended (state
//                                                                          'retracted', retracted_seq)
//   simulations      simulation_id              description, state,        simulation.started,
//                                               started_seq, ended_seq     simulation.ended
//   attachments      (artifact_id, version,     every one but tenant_id:   submission.attach (location
//                    ordinal)                   upload_id, both digests,   'quarantine'); location
//                                               size_bytes,                'bodies' by the claim.promoted
//                                               ciphertext_size,           of that version (when its
//                                               media_type, filename,      payload has
//                                               object_key (<tenant>/      `attachments_served`), 'none'
//                                               <ciphertext_sha256 hex>),  by artifact.erased (when it
//                                               location, review (as       has
//                                               signed), flagged,          `attachments_ciphertext_sha256`)
//                                               attach_seq
//   review_served    (artifact_id, version,     served_seq: the latest     review.served (reviewer = its
//                    item, reviewer)            review.served for the key  principal; ON CONFLICT DO
//                                                                          UPDATE SET served_seq)
//   review_progress  (artifact_id, version,     none: only that the row    no event: written by a
//                    item, reviewer)            names an attachment        reviewer's Range reads
//                                               (item = the ordinal of a   (Attachments::AdvanceProgress)
//                                               submission.attach), else
//                                               it is extra
//
// Timestamps written with the database's now() (created_at, issued_at, revoked_at, retired_at)
// are not in any event: only whether they are NULL is compared (artifacts.submitted_at, which a
// trigger copies from the journal row, is not compared either). No event
// writes review_progress, so no row of it is missing and served_upto and covered (the byte
// ranges a reviewer has read) are not compared: the events do not determine them. jsonb columns
// (body_review, review) are compared as JSON values (PostgreSQL's key order and spacing are not
// the signer's) and reported as nlohmann::json::dump() text. Event types other than those above
// have no fold on these tables (chain.genesis has none; the provider row of `tenants` is inserted
// by `oml init` with the provider genesis, and is expected as name `provider`, created_seq NULL).
//
// Each chain is read in one REPEATABLE READ transaction scoped to its tenant (RLS), journal and
// fold rows from the same snapshot, up to the chain head of that snapshot: a write committing
// meanwhile is either wholly in it (event and rows) or wholly outside. Chains are replayed as
// tasks on a WorkPool, several at once; each task holds the fold state of its own tenant only
// and reads journal and table rows page by page.
//
// The journal is taken as given: run the chain pass first (a forged event folds like a real one).
// Rows of a tenant id that neither a tenant.created nor a `tenants` row names are not visible to
// the application role under RLS, so they are not found (the foreign keys to `tenants` keep them
// out unless those were bypassed too).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/work_pool.h"
#include "db/conn.h"

namespace oml::journal {

enum class FoldDiffKind {
  kChanged,     // the row exists, one column differs
  kMissing,     // an event defines the row; the table has none
  kExtra,       // the table has a row that no event defines
  kUnreadable,  // an event's signed bytes or payload cannot be parsed: the chain is not replayed past it
};

struct FoldDiff {
  std::string table;  // tenants | signing_keys | api_keys | artifacts | simulations | attachments |
                      // review_served | review_progress; "journal" for kUnreadable
  std::string tenant_id, tenant_name;
  std::string key;     // tenant_id, signing key_id, "ak_<16 hex>", "<artifact_id> v<version>", simulation_id,
                       // "<artifact_id> v<version> attachment <ordinal>" (attachments),
                       // "<artifact_id> v<version> item <item> reviewer <principal>" (review_served,
                       // review_progress); "seq N" for kUnreadable
  std::string column;  // kChanged only
  std::string expected, actual;  // kChanged: values ("NULL", "non-NULL" for timestamps); kUnreadable: expected = why
  FoldDiffKind kind = FoldDiffKind::kChanged;
  int64_t seq = 0;  // the event that defines the expected value (kChanged, kMissing, kUnreadable); 0 for kExtra
};

// The report line, without a trailing newline:
//   FOLD <table> tenant <name> <key>: <column> expected <x>, found <y> (seq N)
//   FOLD <table> tenant <name> <key>: missing row (seq N)
//   FOLD <table> tenant <name> <key>: extra row (no event)
//   FOLD journal tenant <name> seq N: cannot recompute the folds: <why>
std::string FormatFoldDiff(const FoldDiff& d);

struct FoldOptions {
  std::string only_tenant;  // name or id; empty = all. The provider's tables are compared only when
                            // it is selected (empty, "provider" or the provider id)
  int page_rows = 0;        // journal and table rows per fetch; 0 = 4096
};

struct FoldReport {
  int64_t tenants = 0;  // chains replayed (and tenants without a chain whose rows were read)
  int64_t events = 0;   // journal events replayed
  int64_t rows = 0;     // fold-table rows read
  // Sorted: provider first, then by tenant name; within a tenant by table, key and column.
  std::vector<FoldDiff> diffs;
};

// REQUIRES: `pool` connects as a role that RLS scopes with oml.tenant_id (oml_app), or one that
// bypasses RLS. Uses one connection per running task; `checks` runs the per-tenant tasks (the
// caller may share it, but must not call this from one of its tasks).
// kNotFound "tenant-not-found" if only_tenant names no tenant; kFailedPrecondition if there is no
// provider chain. Differences are findings in the report, not errors.
Result<FoldReport> VerifyFolds(db::Pool& pool, WorkPool& checks, const FoldOptions& opts);

}  // namespace oml::journal
