// `oml reconcile`: a key-less audit of the lake and the object store against the journal
// (issue 20; seed: "the reconciler that audits the lake against the journal", "store bytes are
// verified against what the signed event says, never store against store").
//
// Authority. The signed journal and the digests it carries are the truth; the lake tables, the
// buckets and the metadata tables are compared with them, never with each other. Run `oml
// verify` for the chain itself: this pass takes the journal as given.
//
// Key-less. Nothing here loads a signing key, a KEK or a DEK (crypto::KeyMaterialUses() stays 0;
// the CLI reports it), and the role it runs as, oml_reconciler (sql/0023_reconciler.sql), has no
// grant on a table that holds a wrapped key. Ciphertext is hashed, never opened.
//
// What is compared, and the finding classes (Finding::cls):
//   bronze/events  every journal event the lake writer has delivered, exactly once and equal to
//                  the journal: missing-in-lake, duplicate-in-lake, extra-in-lake, row-mismatch
//                  (naming the column: signed_bytes, signature, event_hash, prev_hash, the
//                  columns derived from the signed bytes).
//   silver/claims  the journal's folds replayed (journal/chain_fold.h) over the delivered events:
//                  one row per version ever promoted, its state and columns as the newest
//                  delivered event that enqueued it left them: missing-in-lake, state-mismatch
//                  (naming the column), duplicate-in-lake, extra-in-lake, containment-breach (a
//                  row for a version the journal never promoted: a held body's metadata released).
//   gold/daily_activity  the delivered bronze events counted per (tenant, UTC day, workarea,
//                  type): count-mismatch.
//   objects        every object a signed event names (a body kept as an object, an attachment)
//                  where its claim's journalled state says (never promoted: quarantine; promoted
//                  once: bodies; erased: nowhere), with the journalled SHA-256 (and, for an
//                  attachment, size); an inline body's ciphertext hashed in PostgreSQL:
//                  missing-object, object-digest-mismatch, misplaced-object (a never-promoted
//                  claim's object in the bodies bucket is reported with column
//                  "containment-breach"), erased-object-present, orphan-object (no event or
//                  upload session names it), stale-upload (parts of an ended, expired or unknown
//                  upload session). Objects younger than Options::object_grace are never orphans
//                  or stale: a write in progress is not a finding.
//   the lake writer  stale-frontier (the oldest undelivered outbox row older than
//                  Options::stale_after, naming what holds the horizon back, as `oml status`),
//                  dead-lettered (each dead letter not requeued, with its materialize-skipped
//                  seq), uncovered-outbox (a table whose txn is below what the writer recorded it
//                  holds: outbox rows below the frontier no commit of that table covers),
//                  table-unreadable (a data file the table names is missing, or its log is
//                  damaged: its rows cannot be compared; `oml lake rebuild` repairs it).
//
// Incremental. A whole-deployment run (no --tenant) records a checkpoint in oml.reconcile_runs:
// bronze's data files (path, size, modified time), per chain its head seq and event_hash and
// the seqs through which every event had reached bronze, gold and silver, gold's expected
// counts, a SHA-256 of every silver row, and (with the buckets) every named object with the
// size and time it was hashed at. A later run starts from the newest such run without findings
// (the baseline) unless --full: it re-reads only what changed since, i.e.
//   - the journal from each chain's first event not yet delivered everywhere at the baseline,
//   - bronze's data files added since (every baseline file must still be there, unchanged),
//   - the claim versions those events name, replayed from their own events (found through
//     oml.artifacts' and oml.attachments' seq columns, used only as an index: the events
//     themselves come from the journal), whose silver rows and objects are compared in full,
//   - silver whole (one row per promoted claim version; rows of untouched claims against the
//     baseline's digests), gold whole (against the baseline's counts plus the new events),
//   - both buckets listed; an object hashed again only if its size or time changed or its
//     claim moved. Inline bodies of untouched claims are not hashed again.
// Anything else falls back to a full run, and the report says why (full_reason): no baseline,
// a baseline file of bronze removed or rewritten (compaction, VACUUM, damage), a chain whose
// event at the baseline head changed, a table unreadable, behind or whose txn went back.
//
// Delivered. Each table is read first, at one version, with its txn (the last outbox seq it
// holds); then one REPEATABLE READ snapshot of PostgreSQL. Every outbox row at or below a
// table's txn committed before the table was read, so it is in the snapshot: an event is
// delivered to a table iff its outbox row for that table's target is at or below the table's
// txn (rows pruned from the outbox lay below the frontier: delivered), except a dead-lettered
// row, delivered only to the tables it was applied to (dead_letter.applied_tables) or, once
// requeued, when its requeued row is at or below the txn. Lag is therefore never a finding, and
// a table ahead of the frontier is compared exactly.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blob/object_store.h"
#include "common/status.h"
#include "db/conn.h"

namespace oml::reconcile {

struct Finding {
  std::string cls;     // the class, e.g. "missing-in-lake"
  std::string table;   // bronze/events | silver/claims | gold/daily_activity | quarantine | bodies |
                       // postgres | outbox | dead_letter
  std::string tenant;  // tenant uuid; "" when the finding is about no tenant
  int64_t seq = 0;     // the chain seq the finding is about (0: none)
  std::string key;     // object key, "<artifact_id> v<version>", gold key, data file, stream...
  std::string column;  // the column that differs, where one does
  std::string expected, found;  // the journalled value and the value found, where they apply
  std::string detail;  // one sentence for a human

  nlohmann::json ToJson() const;
  std::string ToText() const;  // one line, no newline
};

struct Options {
  std::string stream = "default";
  std::string only_tenant;  // a tenant uuid; empty: every tenant
  std::chrono::seconds stale_after{300};
  std::chrono::seconds object_grace{3600};
  bool objects = true;  // compare the buckets (the slow part: every named object is read)
  // Re-read everything even when a baseline allows an incremental run (see "Incremental" above).
  bool full = false;
  // --since: compare only what the events committed since this time (Unix microseconds; 0: no
  // restriction) left in the lake and the buckets, from the start of its UTC day (gold's days are
  // compared whole). bronze is still scanned whole (only rows of those events are judged); no
  // baseline is used and none is recorded; orphans and stale uploads are not looked for.
  int64_t since_us = 0;
  int page_rows = 4096;  // journal rows per fetch
};

struct Stores {
  blob::ObjectStore* quarantine = nullptr;  // both null: objects are not compared
  blob::ObjectStore* bodies = nullptr;
};

struct Report {
  std::vector<Finding> findings;  // sorted by class, table, tenant, seq, key, column
  int64_t tenants = 0, events = 0;
  int64_t bronze_rows = 0, silver_rows = 0, gold_rows = 0;  // rows read from each table
  std::map<std::string, int64_t> txn;  // table -> its txn version as read (-1: none)
  int64_t objects_listed = 0, objects_read = 0, bytes_hashed = 0;
  uint64_t key_material_uses = 0;  // crypto::KeyMaterialUses() at the end: always 0
  double seconds = 0;
  // Wall seconds of each step, one after the other: "lake" (the tables opened, silver and gold
  // read; its parts "lake.tables", "lake.mode", "lake.scan_start"), "journal" (the snapshot:
  // delivery, the journal replayed, bronze compared; its parts "journal.delivery", ".seeds",
  // ".replay", ".places"), "compare" (bronze's columns named, silver, gold), "objects"; and
  // "bronze_scan", bronze/events read on its own thread during "journal".
  std::map<std::string, double> phase_seconds;
  int64_t started_unix_ms = 0;
  std::map<std::string, int64_t> table_version;  // table -> the Delta version read (-1: none)
  std::map<std::string, int64_t> heads;          // tenant -> the chain head seq audited
  std::string mode = "full";   // "full" | "incremental"
  std::string full_reason;     // why the run was full ("--full", "no baseline", what changed ...)
  int64_t baseline_run = 0;    // incremental: the oml.reconcile_runs id it started from
  int64_t objects_unchanged = 0;  // incremental: objects listed as the baseline hashed them (not read)
  int64_t events_seeded = 0;      // incremental: earlier events of the claims replayed
  // The checkpoint a later incremental run may start from (null: this run cannot be one, and
  // checkpoint_note says why). RecordRun stores it; only a run without findings is a baseline.
  nlohmann::json incremental;
  std::string checkpoint_note;

  std::map<std::string, int64_t> Counts() const;  // class -> findings
  // {"findings": [...], "summary": {...}}
  nlohmann::json ToJson() const;
  std::string ToText() const;  // a line per finding, then a summary line; each ends in '\n'
  // Prometheus text (the node_exporter textfile collector's format): oml_reconcile_findings{class}
  // for every class (0 when none), oml_reconcile_last_run_timestamp_seconds,
  // oml_reconcile_last_run_duration_seconds, oml_reconcile_events_audited.
  std::string PrometheusText() const;
};

// Every finding class, in the order of reconcile.h's table.
const std::vector<std::string>& FindingClasses();

// Records the run in oml.reconcile_runs (sql/0024) over `conn` (not in a transaction):
// findings by class, events, the checkpoint (table versions and txns, chain heads), and how many
// lake.repair events were journalled.
Status RecordRun(db::Conn& conn, const Report& r, const Options& o, int64_t repaired);

// Runs the audit. `conn` connects as oml_reconciler (or a superuser) and is not in a
// transaction. kNotFound "unknown-stream" for a stream without a frontier; kNotFound
// "tenant-not-found" if only_tenant has no chain; kPermissionDenied if the role may not read
// what the audit needs. Differences are findings, never errors.
// The lowercase hex SHA-256 of object `key`, read in 8 MiB ranges; nullopt if it does not exist.
Result<std::optional<std::string>> ObjectSha256(blob::ObjectStore& store, const std::string& key);

Result<Report> Reconcile(db::Conn& conn, const std::string& lake_root, const Stores& stores, const Options& o);

}  // namespace oml::reconcile
