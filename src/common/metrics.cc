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

std::string Metrics::Serialize() const {
  prometheus::TextSerializer s;
  std::ostringstream os;
  s.Serialize(os, registry_->Collect());
  return os.str();
}

}  // namespace oml
