#include "common/metrics.h"

#include <prometheus/text_serializer.h>

#include <sstream>

namespace oml {
namespace {
const prometheus::Histogram::BucketBoundaries kLatency = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                          0.05,   0.1,   0.25,  0.5,   1,    2.5};
}

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  requests_ = &prometheus::BuildCounter().Name("oml_http_requests_total").Help("HTTP requests by route and status").Register(*registry_);
  request_seconds_ = &prometheus::BuildHistogram().Name("oml_http_request_seconds").Help("HTTP request latency").Register(*registry_);
  commits_ = &prometheus::BuildCounter().Name("oml_commits_total").Help("Commit-point transactions by result").Register(*registry_);
  commit_seconds_ = &prometheus::BuildHistogram().Name("oml_commit_seconds").Help("Commit-point transaction latency").Register(*registry_);
  appends_ = &prometheus::BuildCounter()
                  .Name("oml_chain_appends_total")
                  .Help("Journal events appended, all tenants together")
                  .Register(*registry_)
                  .Add({});
  lock_wait_ = &prometheus::BuildHistogram()
                    .Name("oml_advisory_lock_wait_seconds")
                    .Help("Time to acquire the per-tenant chain lock and read the head (round trip 1)")
                    .Register(*registry_)
                    .Add({}, kLatency);
  integrity_ = &prometheus::BuildCounter()
                    .Name("oml_chain_integrity_events_total")
                    .Help("Chain-integrity events: fork-refused, publish-refused, head-invalid")
                    .Register(*registry_);
  durability_reduced_ = &prometheus::BuildGauge()
                             .Name("oml_durability_reduced")
                             .Help("1 when writes are acknowledged without requiring synchronous quorum replication "
                                   "(--reduced-durability or the local profile)")
                             .Register(*registry_)
                             .Add({});
  durability_quorum_ = &prometheus::BuildGauge()
                            .Name("oml_durability_quorum")
                            .Help("1 when the last check found synchronous_commit waiting for a quorum (ANY k) of "
                                  "synchronous standbys")
                            .Register(*registry_)
                            .Add({});
  sync_standbys_streaming_ = &prometheus::BuildGauge()
                                  .Name("oml_durability_sync_standbys_streaming")
                                  .Help("Synchronous standbys streaming from the primary at the last check (-1: "
                                        "cannot be counted)")
                                  .Register(*registry_)
                                  .Add({});
  sync_standbys_required_ = &prometheus::BuildGauge()
                                 .Name("oml_durability_sync_standbys_required")
                                 .Help("Synchronous standbys a commit waits for (k of synchronous_standby_names; "
                                       "0: none configured)")
                                 .Register(*registry_)
                                 .Add({});
  lake_commit_seconds_ = &prometheus::BuildHistogram()
                              .Name("oml_lake_commit_seconds")
                              .Help("Lake writer: one Delta commit (rows, txn and bounds), by table")
                              .Register(*registry_);
  lake_rows_ = &prometheus::BuildCounter()
                    .Name("oml_lake_rows_total")
                    .Help("Lake writer: rows committed to Delta tables, by table")
                    .Register(*registry_);
  lake_batch_rows_ = &prometheus::BuildHistogram()
                          .Name("oml_lake_batch_rows")
                          .Help("Lake writer: outbox rows per applied batch")
                          .Register(*registry_)
                          .Add({}, prometheus::Histogram::BucketBoundaries{1, 10, 100, 1000, 10000, 100000});
  lake_batch_seconds_ = &prometheus::BuildHistogram()
                             .Name("oml_lake_batch_seconds")
                             .Help("Lake writer: one batch from cut to frontier advance")
                             .Register(*registry_)
                             .Add({}, kLatency);
  lake_retries_ = &prometheus::BuildCounter()
                       .Name("oml_lake_retries_total")
                       .Help("Lake writer: failed attempts retried, by kind (conflict, row-refused, error)")
                       .Register(*registry_);
  lake_dead_letters_ = &prometheus::BuildCounter()
                            .Name("oml_lake_dead_letters_total")
                            .Help("Lake writer: outbox rows moved to dead_letter")
                            .Register(*registry_)
                            .Add({});
  lake_compaction_seconds_ = &prometheus::BuildHistogram()
                                  .Name("oml_lake_compaction_seconds")
                                  .Help("Lake writer: one compaction (OPTIMIZE) off the batch path, by table and result")
                                  .Register(*registry_);
  lake_vacuums_ = &prometheus::BuildCounter()
                       .Name("oml_lake_vacuums_total")
                       .Help("Lake writer: VACUUM runs, by table and result")
                       .Register(*registry_);
  lake_vacuum_files_ = &prometheus::BuildCounter()
                            .Name("oml_lake_vacuum_files_deleted_total")
                            .Help("Lake writer: data files VACUUM deleted, by table")
                            .Register(*registry_);
  lake_outbox_pruned_ = &prometheus::BuildCounter()
                             .Name("oml_lake_outbox_pruned_rows_total")
                             .Help("Lake writer: outbox rows pruned (at or below the frontier, past the retention)")
                             .Register(*registry_)
                             .Add({});
  lake_rederived_ = &prometheus::BuildCounter()
                         .Name("oml_lake_rederived_rows_total")
                         .Help("Lake writer: rows re-derived from the journal into a table behind the pruned outbox")
                         .Register(*registry_);
  auto& lake_gauges = prometheus::BuildGauge()
                          .Name("oml_lake_position")
                          .Help("Lake writer: frontier seq, lag in rows past it, age of the oldest of them (s)")
                          .Register(*registry_);
  lake_frontier_ = &lake_gauges.Add({{"what", "frontier_seq"}});
  lake_lag_rows_ = &lake_gauges.Add({{"what", "lag_rows"}});
  lake_lag_seconds_ = &lake_gauges.Add({{"what", "lag_seconds"}});
}

Metrics& Metrics::Get() {
  static Metrics* m = new Metrics();
  return *m;
}

void Metrics::Request(const std::string& method, const std::string& route, int status, double seconds) {
  requests_->Add({{"method", method}, {"route", route}, {"status", std::to_string(status)}}).Increment();
  request_seconds_->Add({{"route", route}}, kLatency).Observe(seconds);
}

void Metrics::Commit(bool ok, double seconds) {
  commits_->Add({{"result", ok ? "committed" : "failed"}}).Increment();
  if (ok) commit_seconds_->Add({}, kLatency).Observe(seconds);
}

void Metrics::ChainAppend() { appends_->Increment(); }

void Metrics::LockWait(double seconds) { lock_wait_->Observe(seconds); }

void Metrics::ChainIntegrity(const std::string& kind) { integrity_->Add({{"kind", kind}}).Increment(); }

void Metrics::Durability(bool reduced, bool quorum) {
  durability_reduced_->Set(reduced ? 1 : 0);
  durability_quorum_->Set(quorum ? 1 : 0);
}

void Metrics::SyncStandbys(int streaming, int required) {
  sync_standbys_streaming_->Set(streaming);
  sync_standbys_required_->Set(required);
}

void Metrics::LakeCommit(const std::string& table, int64_t rows, double seconds) {
  lake_commit_seconds_->Add({{"table", table}}, kLatency).Observe(seconds);
  lake_rows_->Add({{"table", table}}).Increment(static_cast<double>(rows));
}

void Metrics::LakeBatch(int64_t rows, double seconds) {
  lake_batch_rows_->Observe(static_cast<double>(rows));
  lake_batch_seconds_->Observe(seconds);
}

void Metrics::LakeRetry(const std::string& kind) { lake_retries_->Add({{"kind", kind}}).Increment(); }

void Metrics::LakeDeadLetter() { lake_dead_letters_->Increment(); }

void Metrics::LakeCompaction(const std::string& table, const std::string& result, double seconds) {
  lake_compaction_seconds_->Add({{"table", table}, {"result", result}}, kLatency).Observe(seconds);
}

void Metrics::LakeVacuum(const std::string& table, const std::string& result, int64_t files_deleted,
                         double /*seconds*/) {
  lake_vacuums_->Add({{"table", table}, {"result", result}}).Increment();
  lake_vacuum_files_->Add({{"table", table}}).Increment(static_cast<double>(files_deleted));
}

void Metrics::LakeOutboxPruned(int64_t rows) { lake_outbox_pruned_->Increment(static_cast<double>(rows)); }

void Metrics::LakeRederived(const std::string& table, int64_t rows) {
  lake_rederived_->Add({{"table", table}}).Increment(static_cast<double>(rows));
}

void Metrics::LakeLag(int64_t frontier, int64_t rows, double seconds) {
  lake_frontier_->Set(static_cast<double>(frontier));
  lake_lag_rows_->Set(static_cast<double>(rows));
  lake_lag_seconds_->Set(seconds);
}

std::string Metrics::Serialize() const {
  prometheus::TextSerializer s;
  std::ostringstream os;
  s.Serialize(os, registry_->Collect());
  return os.str();
}

}  // namespace oml
