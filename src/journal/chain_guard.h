// The running server's defence against a chain that moves backwards under it.
//
// A failover to a standby that missed the last commits, or a restore from an older backup,
// can rewind a tenant's chain while `oml serve` runs. Without a check the server would then
// assign the lost seqs again and hand out a second, different receipt for the same
// (tenant, seq). ChainGuard remembers, per tenant, the highest (seq, event_hash) this process
// has acknowledged (its own commits) or has read as published (the signed-heads store), and
// holds the write gate: a tenant whose chain was found forked is closed for writes until the
// process restarts (the startup fork check then decides again, from the published heads).
//
// Invariants:
//   * Known(t) only moves forward in seq (a lower or equal seq never replaces it).
//   * Once Close(t) is called, Closed(t) stays set for the life of the process.
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace oml::journal {

class ChainGuard {
 public:
  struct Head {
    int64_t seq = 0;
    std::string event_hash;  // raw 32 bytes
  };

  // Records a head this process acknowledged or read as published. If it is at the seq already
  // known but with another hash, the tenant is closed (two different events were acknowledged or
  // published for one seq) and false is returned.
  bool Observe(const std::string& tenant, int64_t seq, const std::string& event_hash);
  // The highest known head of `tenant` (seq 0 if none).
  Head Known(const std::string& tenant) const;

  // Several replicas: what another replica acknowledged reaches this one through the heads it
  // publishes. With a refresher, MaybeRefresh(t) calls fn(t) (which reads t's published head and
  // Observes it) when t was last refreshed more than `every` ago. Set before the first write.
  void SetRefresher(std::function<void(const std::string&)> fn, std::chrono::milliseconds every);
  // Called by the writer before it reads Known(tenant). Thread-safe; fn runs without the lock.
  void MaybeRefresh(const std::string& tenant);

  // Closes the write gate of `tenant` with a reason; logs a JSON line and counts it once.
  void Close(const std::string& tenant, const std::string& what);
  // The reason `tenant` (or the provider chain, which closes every tenant) is closed, if it is.
  std::optional<std::string> Closed(const std::string& tenant) const;
  bool ProviderClosed() const;
  size_t ClosedCount() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Head> known_;           // GUARDED_BY(mu_)
  std::map<std::string, std::chrono::steady_clock::time_point> refreshed_;  // GUARDED_BY(mu_)
  std::function<void(const std::string&)> refresh_;  // set once, before use
  std::chrono::milliseconds refresh_every_{0};
  std::map<std::string, std::string> closed_;   // GUARDED_BY(mu_)
};

}  // namespace oml::journal
