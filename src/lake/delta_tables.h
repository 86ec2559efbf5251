// Delta Lake tables of the lake (D2), created through rust/oml-storage (delta-rs). `oml init`
// creates them empty so their schema is fixed and documented (docs/data/delta-tables.md); the
// lake writer (lake/lakewriter.h) fills them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "lake/arrow_batch.h"

struct OmlStorageDeltaScan;

struct OmlStorageDeltaTable;

namespace oml::lake {

// Creates `<lake_root>/bronze/events` as an empty Delta table if it does not exist yet.
// lake_root: a local absolute path, file:// URL or s3://bucket/prefix URL.
// Idempotent: an existing table with the same schema is left alone (OK);
// an existing table with a different schema (e.g. one created by an older oml, before the
// payload columns artifact_id .. ciphertext_sha256) is kFailedPrecondition
// "lake-schema-mismatch" naming the missing, unknown and differing columns and the fix; it is
// never altered.
Status EnsureBronzeEvents(const std::string& lake_root);

// Creates every table of the lake that does not exist yet (bronze/events, silver/claims,
// gold/daily_activity), each as EnsureBronzeEvents does (same refusal of a differing schema).
// `oml init` and `oml dev` call it.
Status EnsureLakeTables(const std::string& lake_root);

// The URI of the lake table `name` (e.g. "bronze/events") under lake_root (a local path,
// file:// or s3:// URL): <lake_root>/<name>, one slash between whatever lake_root ends with.
std::string TableUri(const std::string& lake_root, const std::string& name);
// The lake's table paths under the root, in creation order ("bronze/events", ...).
std::vector<std::string> LakeTableNames();

// The columns of the lake table `name` as oml creates it (name, type, nullability, in table
// order), for building an ArrowBatch; kNotFound for a name that is not a lake table.
Result<std::vector<ArrowColumnSpec>> LakeTableColumns(const std::string& name);

// Version of the Delta table at uri (0 right after creation). kNotFound if no table is there.
Result<int64_t> TableVersion(const std::string& table_uri);

// What SetAsideDamagedHead moved out of a table's log.
struct SetAside {
  int64_t count = 0;            // commit files moved to _oml_damaged/
  int64_t lowest_version = -1;  // the lowest of them; -1 if none
};

// Moves the damaged commits at the head of the log of the table at uri (empty, or not a Delta
// commit: what an OS crash before the commit was durable leaves) to <table>/_oml_damaged/, so the
// table reads as of its last intact commit (oml_storage_delta_set_aside_damaged_head). kDataLoss
// "lake-commit-damaged" if a damaged commit remains below an intact one: the table must be rebuilt.
// Only the lake writer that holds the lease calls it (recovery), before it refills the table.
Result<SetAside> SetAsideDamagedHead(const std::string& table_uri);

// ---- The lake writer's table operations (rust/oml-storage, see oml_storage.h) ---------------

// The txn action and commit metadata that go into a commit, in the same commit as its rows.
struct TxnCommit {
  std::string app_id;   // e.g. "oml-lakewriter"; non-empty
  int64_t version = 0;  // the txn version to record (batch_end); >= 0
  // A JSON object whose keys all start with "oml." (e.g. "oml.batch_start", "oml.batch_end",
  // "oml.stream"); anything else is kInvalidArgument. Stored in the commit's commitInfo.
  nlohmann::json metadata = nlohmann::json::object();
};

// A table's last txn for one appId, as of a DeltaTable's snapshot.
struct LastTxn {
  int64_t version = -1;  // -1: no txn for this appId
  // The commit that recorded it: its table version and its "oml." metadata. Unknown (nullopt)
  // when there is no txn or that commit's log file has been cleaned up (Delta keeps it 30 days
  // past a later checkpoint); the txn version itself survives checkpoint and vacuum.
  std::optional<int64_t> commit_version;
  std::optional<nlohmann::json> metadata;
};

// MERGE ON every key column equal: WHEN MATCHED UPDATE SET update_columns, WHEN NOT MATCHED
// INSERT the whole row.
// add_columns: WHEN MATCHED also SET c = target.c + source.c (non-nullable long columns, not
// keys, not update columns); with add columns the rows' keys must be unique (aggregate first).
// newer_column: WHEN MATCHED only if source.c > target.c (a non-nullable long column, neither key
// nor add column): a row older than the stored one (a replay, a requeue, a repair) changes
// nothing, whatever order rows arrive in; rows of one key in one MERGE fold to the newest.
struct MergeSpec {
  std::vector<std::string> key_columns;                      // non-empty; keys never null
  std::optional<std::vector<std::string>> update_columns;    // nullopt: every non-key, non-add column
  std::vector<std::string> add_columns;
  std::string newer_column;                                  // "": every matched row updates
};

// The result of DeltaTable::CheckRows.
struct RowCheck {
  int64_t bad_line = -1;  // 0-based line of the first row that does not fit alone; -1: all fit
  std::string error;      // why it does not fit
};

// A data file of a table's snapshot (DeltaTable::Files): what its add action says, and what one
// listing of the store found under its path.
struct DataFile {
  std::string path;                  // relative to the table root, as the log names it
  int64_t size = 0;                  // the add action's size
  std::optional<int64_t> num_records;  // the add action's stats; nullopt without stats
  std::optional<int64_t> stored_size;  // nullopt: the store lacks the file
  std::optional<int64_t> stored_modified_ms;
};

// A column scan of one snapshot (DeltaTable::Scan): the rows of its data files a batch at a
// time, the columns in the order and types asked for (a column a file lacks reads as nulls).
// A file that is gone is kNotFound; one that is not Parquet of those columns is kDataLoss
// "lake-file-damaged"; both messages name the file. Move-only; one thread at a time.
class ColumnScan {
 public:
  ColumnScan(ColumnScan&& o) noexcept;
  ColumnScan& operator=(ColumnScan&& o) noexcept;
  ColumnScan(const ColumnScan&) = delete;
  ColumnScan& operator=(const ColumnScan&) = delete;
  ~ColumnScan();

  // The next batch (at least one row) into *out; false at the end.
  Result<bool> Next(ArrowBatchView* out);

 private:
  friend class DeltaTable;
  ColumnScan(OmlStorageDeltaScan* h, std::vector<ArrowColumnType> types, std::string uri)
      : handle_(h), types_(std::move(types)), uri_(std::move(uri)) {}
  OmlStorageDeltaScan* handle_ = nullptr;  // owned
  std::vector<ArrowColumnType> types_;
  std::string uri_;
};

// One Delta table opened for the lake writer: a handle on a snapshot (a table version) that
// every read and commit through it is based on.
//
// Rows are JSON lines, one object per row, in the table's columns (binary as hex, timestamp
// as RFC 3339 or integer microseconds); a row that does not fit the schema is kInvalidArgument
// and nothing is committed.
//
// Commits are conditional on the snapshot: if any other commit landed after it, Append/Merge
// return kAborted with type "lake-commit-conflict", commit nothing, and leave the snapshot
// where it was: Refresh, re-read LastTxn, and decide again. A successful commit moves the
// snapshot to the version it wrote. The adapter never compares a commit's txn version with the
// table's: skipping an applied batch is the caller's check.
//
// Move-only; thread-compatible (one thread at a time per object).
class DeltaTable {
 public:
  // Opens the table at table_uri (local path, file:// or s3://) at its latest version.
  // kNotFound if no Delta table is there.
  static Result<DeltaTable> Open(const std::string& table_uri);
  // Open without refusing damaged commits (an empty commit reads as an empty version): only for
  // `oml lake rebuild`, which empties the table and checkpoints it (lake/rebuild.h).
  static Result<DeltaTable> OpenUnchecked(const std::string& table_uri);

  DeltaTable(DeltaTable&& other) noexcept;
  DeltaTable& operator=(DeltaTable&& other) noexcept;
  DeltaTable(const DeltaTable&) = delete;
  DeltaTable& operator=(const DeltaTable&) = delete;
  ~DeltaTable();

  const std::string& uri() const { return uri_; }

  // The snapshot's table version.
  Result<int64_t> SnapshotVersion() const;
  // Moves the snapshot to the latest version and returns it.
  Result<int64_t> Refresh();
  // The last txn for app_id as of the snapshot.
  Result<LastTxn> ReadLastTxn(const std::string& app_id) const;

  // Appends rows (JSON lines, at least one row) with commit's txn action and metadata in one
  // commit. Returns the version written.
  Result<int64_t> Append(const std::string& rows_jsonl, const TxnCommit& commit);
  // The same with the rows as an Arrow batch (at least one row; the lake writer's bronze path):
  // its columns must be the snapshot's, in order, or kInvalidArgument and nothing is committed.
  // The batch is moved out (empty afterwards) whatever the result.
  Result<int64_t> AppendBatch(ArrowBatch* rows, const TxnCommit& commit);
  // The data files the snapshot names that the store lacks (paths relative to the table),
  // from one listing of the table. Empty when the table is whole.
  Result<std::vector<std::string>> MissingFiles() const;

  // Empties the table in one commit (every data file of the snapshot removed) with the txn
  // action and metadata; conditional on the snapshot like every commit ("lake-commit-conflict":
  // nothing committed). Returns the version written. `oml lake rebuild` (lake/rebuild.h).
  Result<int64_t> Truncate(const TxnCommit& commit);

  // MERGE (see MergeSpec) in one commit with the txn action and metadata. Rows apply as if one
  // at a time in their given order: of two rows with one key, the later wins (key and update
  // columns from the last row, other columns from the first, as sequential application would
  // leave them). Returns the version written.
  Result<int64_t> Merge(const std::string& rows_jsonl, const MergeSpec& spec,
                        const TxnCommit& commit);

  // Decodes rows against the snapshot's schema and writes nothing: RowCheck{-1} if every row
  // fits, else the first line that does not fit on its own. Other failures are errors.
  Result<RowCheck> CheckRows(const std::string& rows_jsonl) const;

  // Every row of the snapshot as JSON lines (every column, null explicit), in no particular
  // order. The whole table in memory: for tests and small tables.
  Result<std::string> ReadRowsJsonl() const;

  // The snapshot's data files, with one listing of the store (DataFile).
  Result<std::vector<DataFile>> Files() const;
  // The snapshot's data files as its log names them, without listing the store (stored_size
  // and stored_modified_ms nullopt): what a compaction plans from, at no I/O beyond the
  // snapshot the handle holds.
  Result<std::vector<DataFile>> SnapshotFiles() const;
  // A scan of the snapshot's rows: `columns` by name and type (string, long, timestamp or
  // binary columns of the table; kInvalidArgument otherwise); `files`: nullptr for every data
  // file, or paths as Files() names them (each must be in the snapshot). The snapshot is fixed
  // when the scan opens. See ColumnScan.
  Result<ColumnScan> Scan(const std::vector<ArrowColumnSpec>& columns,
                          const std::vector<std::string>* files = nullptr) const;

  // The snapshot's schema: {"columns": [{"name", "type", "nullable"}, ...] in table order,
  // "partition_columns": [...]}, types named as EnsureBronzeEvents's schemas name them
  // (string, long, integer, binary, timestamp, boolean).
  Result<nlohmann::json> Schema() const;

  // OPTIMIZE: compacts the snapshot's data files smaller than target_bytes into files of about
  // that size in one commit; rows and txn versions are unchanged. Unlike Append and Merge it
  // rebases over commits that landed since the snapshot (appends: the compactor runs beside the
  // writer, lake/compactor.h), never over one that removed a file it rewrote: kAborted
  // "lake-rewrite-stale" if that commit was another rewrite (an OPTIMIZE or Z-order, whoever ran
  // it: landing would keep both copies of the rows), "lake-commit-conflict" if it changed data (a
  // MERGE) or the metadata. Nothing is committed then; Refresh and run it again. Returns {files
  // removed, files added}; {0, 0} when there was nothing to compact (no commit).
  Result<std::pair<int64_t, int64_t>> Optimize(uint64_t target_bytes);

  // Writes a checkpoint of the snapshot version; returns that version.
  Result<int64_t> Checkpoint() const;
  // VACUUM (full mode) after refreshing to the latest version: deletes unreferenced data files
  // older than retention_hours (not clamped to delta.deletedFileRetentionDuration). Returns the
  // number of files deleted. 0 hours can delete a concurrent writer's not-yet-committed files:
  // tests only. Then removes the log files older than delta.logRetentionDuration (30 days) below
  // a checkpoint, unless delta.enableExpiredLogCleanup is off: the batch commits never do.
  Result<int64_t> Vacuum(int64_t retention_hours);

 private:
  DeltaTable(OmlStorageDeltaTable* handle, std::string uri) : handle_(handle), uri_(std::move(uri)) {}
  Result<std::vector<DataFile>> DataFiles(bool list_store) const;

  OmlStorageDeltaTable* handle_ = nullptr;  // owned
  std::string uri_;
};

}  // namespace oml::lake
