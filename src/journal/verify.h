// Chain verification from genesis onward (`oml verify`).
//
// For every tenant (provider first): every seq from 1 to the head is present and contiguous;
// SHA-256 of the stored signed bytes equals the stored event_hash; the signed bytes are canonical
// and their tenant, seq, prev, type and key_id agree with the row; prev links to the previous
// event's hash (zeros at seq 1); the Ed25519 signature verifies under the key in force; a
// customer tenant's genesis references its tenant.created event on the provider chain by
// tenant, seq and event_hash; the chain_heads row equals the last event.
//
// Every chain: `time` never decreases from one event to the next.
//
// Which chains: every tenant.created on the provider chain must have a chain (a tenant whose rows
// were all deleted, its `tenants` row too, is reported under the name tenant.created gave it),
// and every `tenants` row must have a tenant.created. The provider chain is always verified and
// its problems always reported, also with `only_tenant`: every chain hangs on its keys.
//
// Published heads (when `heads` is set): each chain is compared with its published signed head,
// checked against the key chain verified here (anchored in the root key, never the
// signing_keys table). A chain that ends before the published seq (a cut tail), or holds another
// event there, is reported; so is a head document that does not verify, and a head published
// for a tenant the provider chain never created. The published head is read before the chain's
// snapshot, so commits racing with verify never look like a cut tail. Journal rows above the
// chain head are reported too.
//
// Key in force: keys come only from key.issued events of the provider chain, each signed by the
// key it supersedes; a key is issued once. On the provider chain, seq s is signed by the key of
// the latest key.issued with seq < s (the first key also covers the genesis before it). On
// customer chains, an event signed by key K must have a seq above the chain's head recorded in
// the key.issued that issued K and at most the one recorded in the key.issued that retired K
// ("retired_heads": rotation is exclusive with appends, so those are exactly the bounds of what
// K signed). No clock takes part, so no clock skew needs allowing.
#pragma once
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "blob/object_store.h"
#include "common/work_pool.h"
#include "db/conn.h"

namespace oml::journal {

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
  // The signed-heads store (oml-heads/<tenant>); null: chains are not compared with it.
  blob::ObjectStore* heads = nullptr;
  // The pool the row checks run on (not owned; `oml verify --folds` runs its folds pass on the
  // same one). Null: a pool of `threads` threads for this call.
  WorkPool* checks = nullptr;
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
