// Chain verification from genesis onward (`oml verify`).
//
// For every tenant (provider first): every seq from 1 to the head is present and contiguous;
// SHA-256 of the stored signed bytes equals the stored event_hash; the signed bytes are canonical
// and their tenant, seq, prev, type and key_id agree with the row; prev links to the previous
// event's hash (zeros at seq 1); the Ed25519 signature verifies under the key in force; a
// customer tenant's genesis references its tenant.created event on the provider chain by
// tenant, seq and event_hash; the chain_heads row equals the last event.
//
// Key in force: keys come only from key.issued events of the provider chain. On the provider
// chain, seq s is signed by the key of the latest key.issued with seq < s (the first key also
// covers the genesis before it). On customer chains, an event at time t must be signed by a key
// issued at or before t and not retired before t - kRotationGrace (replicas pick up a rotated
// key within that grace).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "db/conn.h"

namespace oml::journal {

inline constexpr int kRotationGraceSeconds = 300;

struct VerifyProblem {
  std::string tenant_id;
  std::string tenant_name;
  int64_t seq = 0;  // first bad seq
  std::string what;
};

struct VerifyOptions {
  std::string only_tenant;  // name or id; empty = all
  int threads = 0;          // threads checking rows (plus twice as many walkers fetching pages); 0 = cores
  int page_rows = 0;        // rows per fetch; 0 = 4096
  // Raw Ed25519 public key of the deployment's first signing key (keys/signing.key.root.pub).
  // When set, the provider chain's first key.issued must carry exactly this key.
  std::string root_public_key;
  // Called now and then with (done, total): events, or tenants when there are more than 16
  // chains. May be called from several threads, never concurrently.
  std::function<void(int64_t, int64_t)> progress;
};

struct VerifyReport {
  int64_t tenants = 0;
  int64_t events = 0;
  std::vector<VerifyProblem> problems;  // at most one per tenant: its first bad seq
};

Result<VerifyReport> VerifyChains(db::Pool& pool, const VerifyOptions& opts);

}  // namespace oml::journal
