// Prometheus metrics of the process (prometheus-cpp core; served by the API at GET /metrics).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
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
  void ChainAppend(const std::string& tenant);
  void LockWait(double seconds);
  // Prometheus text exposition format.
  std::string Serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* request_seconds_;
  prometheus::Family<prometheus::Counter>* commits_;
  prometheus::Family<prometheus::Histogram>* commit_seconds_;
  prometheus::Family<prometheus::Counter>* appends_;
  prometheus::Histogram* lock_wait_;
};

}  // namespace oml
