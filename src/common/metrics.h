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
};

}  // namespace oml
