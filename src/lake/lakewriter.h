// The lake writer (D2): drains one outbox stream into the Delta tables of the lake, exactly once
// per table, by the seed's protocol (docs/data/delta-tables.md "The lake writer's protocol").
//
// One batch, step by step (ApplyBatch / the drain loop):
//   1. Lease.   The writer of a stream is a singleton: it holds a PostgreSQL session advisory lock
//               (key: kLeaseClassId, Fnv1a32(appId)) on its own connection, and bumps
//               lake_frontier.lease_epoch / lease_holder when it takes it. A second writer waits as
//               standby, polling the lock; the lock goes with the holder's session, so a holder
//               killed with SIGKILL hands over as soon as PostgreSQL sees its socket close.
//   2. Recover. On start and after any error: read each target table's last txn for the appId
//               and the bounds its commit recorded; if a table is ahead of the PostgreSQL frontier
//               F, the batch (F, E] (E = the newest txn version) is rebuilt from the outbox by seq
//               range (ReadRange, never a new cut), applied to the tables behind E, and the
//               frontier advances to E.
//   3. Cut.     (frontier, batch_end] inside the stable prefix only (HorizonTracker/StableHorizon,
//               CutBatch); max_rows (size) and the poll interval (time) choose batch_end.
//   4. Group.   Rows by target_table, each group in seq order.
//   5. Check.   Each touched table's last txn version for the appId: batch_end <= it: skip.
//   6. Commit.  Each table's rows in one Delta commit with txn (appId, batch_end) and commit
//               metadata {"oml.batch_start", "oml.batch_end", "oml.stream"}; the commit is
//               conditional on the snapshot the check read (kAborted "lake-commit-conflict" if any
//               other commit landed since: that fences a second writer; the writer then recovers).
//   7. Advance. UPDATE lake_frontier to batch_end (never backwards; fenced by the lease epoch)
//               only after every touched table committed.
//
// Fault points (common/sync_point.h; OML_FAULT=<point>[:kill|:stop] arms them from outside):
//   lakewriter.after_cut                   rows of a new cut read, nothing committed yet
//   lakewriter.before_commit.<table>       check done, the table's commit not yet written
//   lakewriter.after_commit.<table>        that table's commit written (e.g. ...bronze/events)
//   lakewriter.before_frontier_advance     every touched table committed, frontier not moved
//
// Roles: connects as oml_lakewriter (sql/0008_lakewriter.sql). The connection must be a real
// session (not a transaction-pooling proxy): the lease is that session's advisory lock.
// Thread safety: a LakeWriter is used by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "db/conn.h"
#include "lake/delta_tables.h"
#include "lake/outbox_cut.h"

namespace oml::lake {

// The first key of the lease's advisory lock ("omlw"); the second is Fnv1a32(AppIdFor(stream)).
inline constexpr int32_t kLeaseClassId = 0x6f6d6c77;
int32_t Fnv1a32(std::string_view s);

// A Delta table an outbox row can target: its name (= outbox.target_table = its path under the
// lake root) and its binary columns (base64 in outbox.row_data, hex in the adapter's JSON rows).
struct TargetTable {
  std::string name;
  std::vector<std::string> binary_columns;
};

// The registry of target tables, in the order a batch commits them. Today: bronze/events.
const std::vector<TargetTable>& TargetTables();

// One outbox row as the Delta adapter's JSON line (with its trailing '\n'): row_data's keys
// passed through unchanged, except that the table's binary columns go from base64 to hex and
// "outbox_seq" is set to row.seq. kInvalidArgument "invalid-outbox-row" if row_data is not a
// JSON object or a binary column is neither null nor valid base64.
Result<std::string> ToDeltaRow(const OutboxRow& row, const TargetTable& table);

struct LakeWriterOptions {
  std::string database_url;  // libpq URL of oml_lakewriter
  std::string lake_root;     // local path, file:// or s3:// URL; tables at <lake_root>/<name>
  std::string stream = kDefaultStream;
  int64_t max_rows = 10000;                          // rows per batch at most (>= 1)
  std::chrono::milliseconds poll_every{200};         // horizon poll when idle (service mode)
  std::chrono::milliseconds standby_poll{500};       // lease poll while standby
  std::chrono::milliseconds once_horizon_wait{60000};  // --once: wait this long for a stable horizon
  std::chrono::milliseconds max_backoff{10000};      // after repeated errors
  // --once: give up after this many consecutive failed attempts (a retryable error each).
  int once_max_attempts = 5;
  // TEST ONLY (`oml lakewriter --test-bypass-lease`): do not take the lease, and advance the
  // frontier without the epoch fence, so that two writers run at once on purpose and the Delta
  // conflict is the only fence left (tests/test_lakewriter.py). Never in a deployment.
  bool bypass_lease = false;
  std::string holder;  // written to lake_frontier.lease_holder; default host:pid:random
};

// What a writer has done so far (for tests and logs).
struct LakeWriterStats {
  int64_t batches = 0;            // batches whose frontier advance succeeded
  int64_t rows = 0;               // rows committed to Delta tables
  int64_t commits = 0;            // Delta commits written
  int64_t skipped_tables = 0;     // table parts skipped by the txn check
  int64_t conflicts = 0;          // commits lost to another writer (lake-commit-conflict)
  int64_t recovered_batches = 0;  // batches rebuilt from a table ahead of the frontier
  int64_t lease_acquisitions = 0;
};

class LakeWriter {
 public:
  explicit LakeWriter(LakeWriterOptions o);
  LakeWriter(const LakeWriter&) = delete;
  LakeWriter& operator=(const LakeWriter&) = delete;
  ~LakeWriter();

  // The service loop: lease (standby until it is free), recover, then cut and apply batches as
  // the stable horizon moves, until *stop. Errors are logged and retried through recovery with
  // a growing backoff (a lost commit race: at once). Returns OK when stopped.
  Status Run(const std::atomic<bool>* stop);

  // `oml lakewriter --once`: lease, recover, take one stable horizon (waiting at most
  // once_horizon_wait), drain up to it, return OK. A retryable error (kAborted, kUnavailable,
  // kInternal) is retried through recovery up to once_max_attempts times in a row; any other is
  // returned at once. `stop` may be null.
  Status RunOnce(const std::atomic<bool>* stop = nullptr);

  // One attempt to take the lease (connects first if needed). true: held (lease_epoch() is the
  // new epoch); false: another session holds it.
  Result<bool> TryAcquireLease();

  // Steps 2 (and 7): see the header comment. Connects first if needed. Returns the frontier.
  // REQUIRES: the lease is held, or bypass_lease.
  Result<int64_t> Recover();

  int64_t frontier() const { return frontier_; }
  int64_t lease_epoch() const { return epoch_; }
  bool lease_held() const { return lease_held_; }
  const LakeWriterStats& stats() const { return stats_; }
  const std::string& app_id() const { return app_id_; }

 private:
  struct Batch {
    int64_t start = 0;  // exclusive: the frontier it was cut or rebuilt from
    int64_t end = 0;    // inclusive: batch_end, the txn version its commits record
    std::vector<OutboxRow> rows;  // every row with start < seq <= end, ascending by seq
  };

  Status Connect();
  Status EnsureConnected();
  void Disconnect();
  Result<DeltaTable*> Table(const std::string& name);
  // Waits (standby) until the lease is held or *stop. false: stopped.
  Result<bool> AcquireLease(const std::atomic<bool>* stop);
  // The lease is still ours: our session is alive and the epoch is unchanged.
  Status CheckLease();
  // Steps 4 to 7 for one batch (a new cut or a rebuilt one).
  Status ApplyBatch(const Batch& b);
  Status AdvanceFrontier(int64_t batch_end);
  // One session of work: connect, lease, recover, then drain (once: to once_target_).
  Status Session(const std::atomic<bool>* stop, bool once);
  Status CutAndApply(int64_t horizon);
  Status Loop(const std::atomic<bool>* stop, bool once);

  LakeWriterOptions opts_;
  OutboxStream stream_;
  std::string app_id_;
  std::unique_ptr<db::Conn> conn_;
  std::map<std::string, DeltaTable> tables_;
  bool lease_held_ = false;
  int64_t epoch_ = 0;
  int64_t frontier_ = 0;
  std::optional<int64_t> once_target_;
  LakeWriterStats stats_;
};

}  // namespace oml::lake
