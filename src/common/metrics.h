// Prometheus metrics of the process (prometheus-cpp core; served at GET /metrics).
//
// No series carries a tenant label: a thousand tenants would make a thousand series per metric,
// and the endpoint would list every tenant id. Labels are bounded sets (method, route, status,
// result, kind). Per-tenant detail lives in the log lines (each names its tenant) and in the
// journal itself (a chain's head seq counts its events).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace oml {

class Metrics {
 public:
  Metrics();
  // Process-wide instance. Thread-safe.
  static Metrics& Get();

  void Request(const std::string& method, const std::string& route, int status, double seconds);
  void Commit(bool ok, double seconds);
  // One journal event appended (any tenant; no tenant label, see above).
  void ChainAppend();
  void LockWait(double seconds);
  // Chain-integrity events: kind = fork-refused (a write refused on a rewound or diverged chain),
  // publish-refused (a published head the new head does not extend), head-invalid (a published
  // head document that does not verify; repaired by republishing).
  void ChainIntegrity(const std::string& kind);
  // Durability (db/durability.h), set by every check: oml_durability_reduced 1 when the server
  // acknowledges writes without requiring synchronous quorum replication (--reduced-durability,
  // or the local profile); oml_durability_quorum 1 when the last check found it configured.
  // Writes are refused (503 durability-reduced) while both are 0.
  void Durability(bool reduced, bool quorum);
  // oml_durability_sync_standbys_streaming (-1: unknown) and oml_durability_sync_standbys_required
  // (k of synchronous_standby_names, 0: none), set by every check: streaming < required means
  // every commit waits (db::StandbyCount::BelowQuorum).
  void SyncStandbys(int streaming, int required);
  // The lake writer (lake/lakewriter.h); labels: table (the lake's three tables), result.
  // One Delta commit of `rows` rows to `table` that took `seconds` (oml_lake_commit_seconds,
  // oml_lake_rows_total).
  void LakeCommit(const std::string& table, int64_t rows, double seconds);
  // One batch applied (frontier advanced): its rows (oml_lake_batch_rows) and duration.
  void LakeBatch(int64_t rows, double seconds);
  // A failed attempt that the writer retries, by kind: conflict (another writer committed),
  // rebase (a commit lost to a compaction, made again at once), row-refused (a poison row's
  // attempt), error (anything else) (oml_lake_retries_total).
  void LakeRetry(const std::string& kind);
  void LakeDeadLetter();  // oml_lake_dead_letters_total
  // One compaction request of `table` done off the batch path (lake/compactor.h), by result:
  // compacted, nothing (no file to compact), failed, no-lease (dropped: this process does not
  // hold the lease); and one observation per attempt refused because a newer rewrite removed a
  // file it read, result refused (oml_lake_compaction_seconds).
  void LakeCompaction(const std::string& table, const std::string& result, double seconds);
  // One VACUUM of `table` by the lake writer (LakeWriterOptions::vacuum_every), result ok or
  // failed: oml_lake_vacuums_total{table,result} and oml_lake_vacuum_files_deleted_total{table}.
  void LakeVacuum(const std::string& table, const std::string& result, int64_t files_deleted, double seconds);
  // Outbox rows the lake writer pruned (oml_lake_outbox_pruned_rows_total) and rows it re-derived
  // from the journal into a table behind what was pruned (oml_lake_rederived_rows_total{table}).
  void LakeOutboxPruned(int64_t rows);
  void LakeRederived(const std::string& table, int64_t rows);
  // Where the stream stands, set every poll: frontier, rows enqueued past it, and the age of the
  // oldest of them in seconds (0 when none) (oml_lake_frontier_seq, oml_lake_lag_rows,
  // oml_lake_lag_seconds).
  void LakeLag(int64_t frontier, int64_t rows, double seconds);
  // Prometheus text exposition format.
  std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* request_seconds_;
  prometheus::Family<prometheus::Counter>* commits_;
  prometheus::Family<prometheus::Histogram>* commit_seconds_;
  prometheus::Counter* appends_;
  prometheus::Histogram* lock_wait_;
  prometheus::Family<prometheus::Counter>* integrity_;
  prometheus::Gauge* durability_reduced_;
  prometheus::Gauge* durability_quorum_;
  prometheus::Gauge* sync_standbys_streaming_;
  prometheus::Gauge* sync_standbys_required_;
  prometheus::Family<prometheus::Histogram>* lake_commit_seconds_;
  prometheus::Family<prometheus::Counter>* lake_rows_;
  prometheus::Histogram* lake_batch_rows_;
  prometheus::Histogram* lake_batch_seconds_;
  prometheus::Family<prometheus::Counter>* lake_retries_;
  prometheus::Counter* lake_dead_letters_;
  prometheus::Family<prometheus::Histogram>* lake_compaction_seconds_;
  prometheus::Family<prometheus::Counter>* lake_vacuums_;
  prometheus::Family<prometheus::Counter>* lake_vacuum_files_;
  prometheus::Counter* lake_outbox_pruned_;
  prometheus::Family<prometheus::Counter>* lake_rederived_;
  prometheus::Gauge* lake_frontier_;
  prometheus::Gauge* lake_lag_rows_;
  prometheus::Gauge* lake_lag_seconds_;
};

}  // namespace oml
