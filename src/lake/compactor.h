// Compaction of lake tables off the lake writer's batch path.
//
// The writer asks for an append-only table's compaction (bronze/events) after every
// LakeWriterOptions::compact_every commits to it (Request, which never blocks). A Compactor runs each request on its own thread with its
// own table handles: an OPTIMIZE (DeltaTable::Optimize) that bin-packs the files smaller than the
// target size. The writer keeps cutting and committing batches meanwhile, so a compaction, however
// long, adds no latency to a batch.
//
// Concurrency with the writer's commits and other rewrites (docs/data/delta-tables.md
// "Compaction"):
//   - An OPTIMIZE rewrites files with dataChange = false and carries no txn action. It rebases
//     over commits that landed since its snapshot and removed none of the files it rewrote (the
//     writer's appends). It never lands over one that did: "lake-rewrite-stale" when that commit
//     was another rewrite of them (an operator's OPTIMIZE or Z-order, another process's
//     compactor: landing would store their rows twice), "lake-commit-conflict" when it was a
//     MERGE. Either way it is tried again on a fresh snapshot, up to kMaxAttempts times; the files
//     a refused attempt wrote are orphans for VACUUM.
//   - Only the lease holder compacts: Options::lease_check runs before each OPTIMIZE, and a
//     request whose check fails is dropped (Stats::no_lease) without an OPTIMIZE.
//   - A writer commit that loses to an OPTIMIZE (the table moved past its check, and the txn of
//     its appId did not) re-checks and commits again (LakeWriter::ApplyParts); a commit that
//     loses to another writer (the txn moved) is fenced as before.
// Rows and txn versions are never changed by a compaction.
//
// Sync points (tests), on the compactor's thread, each attempt:
//   "lakewriter.compaction.before.<table>"          before the snapshot is read; a non-OK status
//                                                    fails the request.
//   "lakewriter.compaction.after_snapshot.<table>"  the snapshot read (refreshed), the OPTIMIZE that
//                                                    plans and commits from it not yet begun.
//
// Thread safety: Request, Drain and stats may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/status.h"
#include "lake/delta_tables.h"

namespace oml::lake {

class Compactor {
 public:
  // Two tiers, so that no compaction rewrites the whole table: a run bin-packs only the files
  // below small_target_bytes (the small files of the last commits, and at most one partly filled
  // bin) into files of about that size, unless the snapshot holds large_every or more files
  // between small_target_bytes and target_bytes (mostly the small tier's outputs since the last
  // large run): then it bin-packs every file below target_bytes. The tier is read from the
  // table's snapshot each run, never from a count this process keeps, so a writer restarted
  // often still reaches the large tier. Work per run is bounded by the data committed since the
  // run before plus large_every small targets plus one target, not by the table's size; files
  // per table by the table's size / target_bytes + large_every + the small files.
  struct Options {
    std::string lake_root;  // tables at <lake_root>/<name>, as the writer's
    std::string stream;     // for logs
    uint64_t target_bytes = uint64_t{128} << 20;
    uint64_t small_target_bytes = uint64_t{16} << 20;  // <= target_bytes
    int large_every = 8;                               // >= 1 (1: every run is large)
    // Called on the compactor's thread right before each OPTIMIZE: OK if this process holds the
    // stream's lease (LakeWriter's check). Empty: no check (tests of the Compactor alone).
    std::function<Status()> lease_check;
  };
  struct Stats {
    int64_t requests = 0;     // Request calls (a request for a table already queued coalesces)
    int64_t compactions = 0;  // OPTIMIZE commits written
    int64_t files_removed = 0;
    int64_t files_added = 0;
    int64_t failures = 0;     // requests given up after kMaxAttempts or a non-conflict error
    int64_t large_runs = 0;   // OPTIMIZEs run with target_bytes (the others: small_target_bytes)
    int64_t refused = 0;      // attempts refused by the adapter: a newer rewrite removed a file
                              // this one read ("lake-rewrite-stale"); retried on a fresh snapshot
    int64_t no_lease = 0;     // requests dropped because lease_check failed (no OPTIMIZE run)
  };
  static constexpr int kMaxAttempts = 4;

  explicit Compactor(Options o);
  Compactor(const Compactor&) = delete;
  Compactor& operator=(const Compactor&) = delete;
  // Finishes the compaction in progress (an OPTIMIZE cannot be interrupted) and drops the
  // requests still queued.
  ~Compactor();

  // Queues a compaction of `table` unless one is queued already. Never blocks on a compaction.
  void Request(const std::string& table);
  // Blocks until no request is queued or running (`oml lakewriter --once` calls it before it
  // exits, so that the compactions its drain asked for are done).
  void Drain();
  Stats stats() const;

 private:
  void Loop();
  // One request: up to kMaxAttempts OPTIMIZE attempts on a fresh snapshot each.
  void CompactOne(const std::string& table);

  const Options opts_;
  std::map<std::string, DeltaTable> tables_;  // the compactor thread's own handles
  mutable std::mutex mu_;
  std::condition_variable cv_;       // a request queued, or stopping
  std::condition_variable idle_cv_;  // the queue emptied and nothing runs
  std::deque<std::string> queue_;    // GUARDED_BY(mu_)
  bool running_ = false;             // GUARDED_BY(mu_): a request is being compacted
  bool stop_ = false;                // GUARDED_BY(mu_)
  Stats stats_;                      // GUARDED_BY(mu_)
  std::thread thread_;               // last: starts after every other member exists
};

}  // namespace oml::lake
