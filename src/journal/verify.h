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
// Sources (ChainSource): PostgreSQL, or the lake's bronze/events (`oml verify --from-lake`,
// lake/verify_lake.h), which is a prefix of the journal: there a chain that ends before its
// published head is the lake writer's lag while the head is younger than prefix_lag_grace, and
// a finding once it is older; there is no chain_heads row (the head is the last row).
//
// Key in force: keys come only from key.issued events of the provider chain, each signed by the
// key it supersedes and checked by the one key-chain rule (CheckKeyIssued, journal/provider.h:
// a rotation's retired_heads must be bound by the key it issues); a key is issued once. On the provider chain, seq s is signed by the key of
// the latest key.issued with seq < s (the first key also covers the genesis before it). On
// customer chains, an event signed by key K must have a seq above the chain's head recorded in
// the key.issued that issued K and at most the one recorded in the key.issued that retired K
// ("retired_heads": rotation is exclusive with appends, so those are exactly the bounds of what
// K signed). No clock takes part, so no clock skew needs allowing.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "blob/object_store.h"
#include "common/work_pool.h"
#include "db/conn.h"
#include "journal/event.h"
#include "journal/provider.h"

namespace oml::journal {

// One journal row as verification reads it. Hashes and the signature are raw bytes.
struct ChainRow {
  int64_t seq = 0;
  std::string prev_hash, event_hash, type, key_id, signed_bytes, signature;
  // Further columns a source keeps beside the chain's own (the lake: the bronze row's principal,
  // occurred_at and payload columns), checked by its CheckRow; null for PostgreSQL.
  nlohmann::json columns;
  // A source's finding about the row itself (a column that does not decode); reported at its
  // seq before the link and row checks. Empty: none.
  std::string defect;
};

// Where VerifyChains reads the chains: PostgreSQL (VerifyChains(db::Pool&, ...)) or the lake's
// bronze/events table (lake/verify_lake.h). The checks are the same; a source supplies rows and
// heads, its own per-row check, and the wording of a missing chain.
//
// REQUIRES: Open() first, once; every later read sees the state Open() fixed. After Open(),
// every method may be called from several threads at once.
class ChainSource {
 public:
  struct ChainHead {
    int64_t seq = 0;         // 0: the chain has no head
    std::string event_hash;  // raw
    // The Merkle edge the commit point keeps with the head (sql/0029; journal/merkle_edge.h):
    // the size it covers and its hashes. nullopt: none kept (not built yet, or a source without
    // one, the lake). The walk checks it against the chain's own tree.
    std::optional<int64_t> tree_size;
    std::string tree_edge;
  };
  struct FirstPage {
    ChainHead head;
    std::vector<ChainRow> rows;  // ascending seq, from seq 1 up to head.seq, about `limit` rows
    int64_t above_head = 0;      // lowest stored seq above the head; 0 if none
    std::string hash_at;         // event_hash stored at the requested seq; "" if none
  };

  virtual ~ChainSource() = default;
  // Fixes the state every later read sees.
  virtual Status Open() = 0;
  // The tenants the source registers, provider first (PostgreSQL: the tenants table; the lake:
  // every tenant with a row). kFailedPrecondition if there is no provider chain.
  virtual Result<std::vector<TenantInfo>> Tenants() = 0;
  virtual Result<ChainHead> Head(const std::string& tenant) = 0;
  // The head, and the rows from seq 1 up to it (at most `limit`, more only to keep rows of one
  // seq together); hash_seq > 0: also the event_hash stored at hash_seq.
  virtual Result<FirstPage> HeadAndFirstPage(const std::string& tenant, int64_t hash_seq, int limit) = 0;
  // Rows with after < seq <= upto, ascending, at most `limit` (more only as above).
  virtual Result<std::vector<ChainRow>> Page(const std::string& tenant, int64_t after, int64_t upto, int limit) = 0;
  // The chain's first key.issued row; empty if none.
  virtual Result<std::vector<ChainRow>> FirstKeyIssued(const std::string& tenant) = 0;
  // The source's own check of a row whose hash and envelope agree with its chain columns; the
  // failure's message is reported at the row's seq. Runs concurrently on the check pool.
  virtual Status CheckRow(const std::string& tenant, const ChainRow& row, const Envelope& env) const {
    return Status::Ok();
  }
  // True when the source is a prefix of the journal that may lag it (the lake): a chain shorter
  // than its published head, or a tenant.created that is the provider chain's last event with
  // no genesis yet, is then the lag, not a finding.
  virtual bool IsPrefix() const { return false; }
  // The finding for a tenant.created without a chain; registered: Tenants() lists the tenant.
  virtual std::string MissingChain(bool registered) const = 0;
};

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
  // A prefix source (the lake): a chain that ends before a head published longer ago than this
  // is a finding (the lake lacks events it should hold by now: a hole, or a stopped lake
  // writer); a younger published head is the lake writer's lag. `oml verify --lag-grace`.
  std::chrono::seconds prefix_lag_grace{60};
  // Transparency logs (issue 23), PostgreSQL sources only: with `checkpoints`, each chain's
  // published checkpoint (oml-tlog/<tenant>/checkpoint in `heads`) must open with a key of the
  // anchored key chain under its own origin, which must end with "/<tenant>" (any tlog_origin:
  // verify needs no setting of the servers'), and its root must be the chain's tree at its size.
  // With `seen_checkpoints_dir` also set, the checkpoint an earlier run verified
  // (<dir>/<root key>/<tenant>) must still be the chain's tree at its size, and the published one
  // must not be behind it (a rolled-back object store); the pair is named when either fails. A
  // chain found clean records the larger of the two there for the next run.
  bool checkpoints = false;
  std::string seen_checkpoints_dir;
  // Called now and then with (done, total): events, or tenants when there are more than 16
  // chains. May be called from several threads, never concurrently.
  std::function<void(int64_t, int64_t)> progress;
};

struct VerifyReport {
  int64_t tenants = 0;
  int64_t events = 0;
  std::vector<VerifyProblem> problems;  // at most one per tenant: its first bad seq
};

// Verifies the chains in PostgreSQL (`oml verify`).
Result<VerifyReport> VerifyChains(db::Pool& pool, const VerifyOptions& opts);
// Verifies the chains `source` holds, with the same checks (`oml verify --from-lake`).
Result<VerifyReport> VerifyChains(ChainSource& source, const VerifyOptions& opts);

}  // namespace oml::journal
