// Each chain's Merkle tree (issue 23; src/merkle/merkle.h): its entries are the events'
// signed_bytes in seq order. The commit point keeps the tree's right edge in chain_heads
// (tree_size, tree_edge; sql/0029) in every append's transaction (journal.cc). A chain that
// existed before 0029 has none yet: BuildMissingTrees builds it from the journal, without
// rewriting anything, and without holding the chain's lock while it reads: it reads up to the
// head it found, then, under the lock, only the events appended meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/periodic.h"
#include "common/status.h"
#include "db/conn.h"
#include "merkle/merkle.h"

namespace oml::journal {

struct TreeBuildReport {
  int chains = 0;       // trees built
  int64_t leaves = 0;   // events read to build them
  int failed = 0;       // chains whose edge could not be built (logged)
};

// Builds the tree edge of every chain (every tenant's and the provider's) that has none. A
// chain that fails (kDataLoss "integrity" for a gap in its seqs, a database error) is logged and
// skipped, and the others are still built; the error then names how many failed and the first.
// Stops between batches of events and between chains once *stop is true (a chain stopped
// midway keeps no edge). A head found behind the events read (a restore meanwhile) builds none.
Result<TreeBuildReport> BuildMissingTrees(db::Pool& pool, const std::atomic<bool>* stop = nullptr);

// Runs BuildMissingTrees at start and every `interval` until destroyed (`oml serve`); the
// destructor stops a build in progress at its next batch.
class TreeBuilder {
 public:
  TreeBuilder(db::Pool* pool, std::chrono::milliseconds interval);
  ~TreeBuilder();

 private:
  void BuildOnce();
  db::Pool* pool_;
  std::atomic<bool> stop_{false};
  PeriodicThread thread_;  // last: runs BuildOnce
};

// The chain's tree as the journal holds it now (read in batches, no lock): for `oml verify`
// and the tests. kDataLoss "integrity" if the seqs are not 1, 2, 3, ...
Result<merkle::CompactRange> TreeFromJournal(db::Conn& conn, const std::string& tenant, int64_t upto_seq);

// The stored edge of the chain (nullopt if not built). kDataLoss "integrity" if it is malformed.
Result<std::optional<merkle::CompactRange>> StoredTree(db::Conn& conn, const std::string& tenant);

}  // namespace oml::journal
