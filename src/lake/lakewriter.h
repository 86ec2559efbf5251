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
//               and the bounds its commit recorded. A table whose txn is below what it committed
//               (oml.lake_table_txn, recorded with each frontier advance: its newest commits were
//               lost, or it was replaced by an empty table) is refilled first, (txn, frontier] in
//               batches of max_rows, before anything is committed above the hole. If a table is ahead of the PostgreSQL frontier
//               F, the batch (F, E] (E = the newest txn version) is rebuilt from the outbox by seq
//               range (ReadRange, never a new cut), applied to the tables behind E, and the
//               frontier advances to E.
//   3. Cut.     (frontier, batch_end] inside the stable prefix only (HorizonTracker/StableHorizon,
//               CutBatch); max_rows (size) and the poll interval (time) choose batch_end.
//   4. Group.   Rows by target_table, each group in seq order.
//   5. Check.   Each touched table's last txn version for the appId: batch_end <= it: skip.
//               (Read from this writer's own last commit while the handle's snapshot is still
//               at it; else from a refreshed snapshot.)
//   6. Commit.  Each table's rows in one Delta commit with txn (appId, batch_end) and commit
//               metadata {"oml.batch_start", "oml.batch_end", "oml.stream"}; the commit is
//               conditional on the snapshot the check read (kAborted "lake-commit-conflict" if any
//               other commit landed since). The touched tables commit at once, one thread each
//               (they are independent logs), so a failed batch may have reached any subset of
//               them; recovery (step 2) finishes the others from the bounds one of them recorded.
//               A winner that moved this appId's txn is another writer: fenced, the batch fails
//               and recovery follows. Any other winner (a compaction, lake/compactor.h): steps 5
//               and 6 again for that table, on a fresh snapshot.
//   7. Advance. UPDATE lake_frontier to batch_end (never backwards; fenced by the lease epoch)
//               only after every touched table committed. In service mode gold may trail the
//               frontier (LakeWriterOptions::gold_every): its counts are kept in memory, and
//               gold's txn still says exactly which bronze rows it holds.
//
// Fault points (common/sync_point.h; OML_FAULT=<point>[:kill|:stop] arms them from outside):
//   lakewriter.after_cut                   rows of a new cut read, nothing committed yet
//   lakewriter.before_commit.<table>       the round's tables checked, none of its commits
//                                          begun (reached for each table, in registry order)
//   lakewriter.commit.<table>              on the thread committing that table, its commit not
//                                          begun; the round's other tables commit meanwhile
//   lakewriter.after_commit.<table>        every commit of the round ended; reached for each
//                                          table that landed (e.g. ...bronze/events), in order
//   (A round: the tables of a batch committed at once; one that lost to a compaction is
//   committed again in the next round.)
//   lakewriter.before_frontier_advance     every touched table committed, frontier not moved
//   lakewriter.gold_flush.before_commit    gold's kept counts about to be committed alone (FlushGold)
//   lakewriter.gold_flush.after_commit     that commit landed, its lake_table_txn not recorded
//   lakewriter.compaction.after_snapshot.<table>  a compaction's snapshot read, its OPTIMIZE not
//                                          begun (bronze: the compactor's thread, lake/compactor.h;
//                                          silver and gold: the batch path, after the advance)
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
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "common/work_pool.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "lake/compactor.h"
#include "lake/dead_letter.h"
#include "lake/delta_tables.h"
#include "lake/outbox_cut.h"
#include "lake/rederive.h"

namespace oml::lake {

// The first key of the lease's advisory lock ("omlw"); the second is Fnv1a32(AppIdFor(stream)).
inline constexpr int32_t kLeaseClassId = 0x6f6d6c77;
int32_t Fnv1a32(std::string_view s);

// How a batch's part is written to a table.
enum class TableWrite {
  kAppend,  // one row per outbox row (bronze/events)
  kMerge,   // MERGE on the key columns, in seq order (silver/claims: retracts set state)
};

// A Delta table of the lake: its name (= outbox.target_table = its path under the lake root),
// its binary columns (standard base64 in outbox.row_data and in the adapter's JSON rows), how it is
// written, and whether its rows are derived by the writer from the batch's bronze rows (gold)
// instead of coming from outbox rows (no outbox row may target a derived table).
struct TargetTable {
  std::string name;
  std::vector<std::string> binary_columns;
  TableWrite write = TableWrite::kAppend;
  MergeSpec merge;  // kMerge only
  bool derived = false;
};

// The registry of lake tables, in the order a batch commits them: bronze/events (append),
// silver/claims (merge on tenant_id, artifact_id, version), gold/daily_activity (derived, merge
// with `events` added).
const std::vector<TargetTable>& TargetTables();

// gold/daily_activity's rows for a batch: the bronze rows among `rows` (target bronze/events)
// with seq > above_seq, counted per (tenant_id, UTC day of occurred_at, workarea_id or "",
// event_type), as the adapter's JSON lines, keys unique, sorted by key; last_outbox_seq is the
// highest seq counted. kInvalidArgument "invalid-outbox-row" naming the seq of a bronze row whose
// tenant_id, event_type or occurred_at is missing or malformed (*bad_seq set to it).
Result<std::string> DailyActivityRows(const std::vector<const OutboxRow*>& rows, int64_t above_seq,
                                      int64_t* bad_seq = nullptr);

// gold/daily_activity's counts, kept across batches while the writer lets gold trail the
// frontier (LakeWriterOptions::gold_every): key (tenant_id, day, workarea_id, event_type).
struct DailyActivityCount {
  int64_t events = 0;
  int64_t last_outbox_seq = 0;
};
using DailyActivityCounts =
    std::map<std::tuple<std::string, std::string, std::string, std::string>, DailyActivityCount>;
// DailyActivityRows in two steps: CountDailyActivity adds the rows' counts to *counts (on an
// error *counts holds part of them: count into a copy), DailyActivityJson renders counts as
// DailyActivityRows does.
Status CountDailyActivity(const std::vector<const OutboxRow*>& rows, int64_t above_seq, DailyActivityCounts* counts,
                          int64_t* bad_seq = nullptr);
std::string DailyActivityJson(const DailyActivityCounts& counts);

// One outbox row as the Delta adapter's JSON line, for the MERGE tables (silver; appends build an
// Arrow batch with AppendDeltaRow instead), with its trailing '\n': row_data's keys
// passed through unchanged (the table's binary columns stay base64, which the adapter decodes)
// and "outbox_seq" set to row.seq. kInvalidArgument "invalid-outbox-row" if row_data is not a
// JSON object or a binary column is neither null nor standard base64.
Result<std::string> ToDeltaRow(const OutboxRow& row, const TargetTable& table);

// One outbox row appended to `batch` (the table's columns, lake/arrow_batch.h): each row_data
// member into its column (string: the JSON string unescaped; binary: standard base64 decoded;
// long: a JSON integer; timestamp: RFC 3339 text or integer microseconds since the epoch, UTC;
// null where the column is nullable) and outbox_seq = row.seq. A member the table has no
// column for, a value of another type, a missing or null non-nullable column:
// kInvalidArgument "invalid-outbox-row" naming the seq and the column, and the batch is as
// before. Gives what ToDeltaRow's JSON line gives through the adapter's JSON decoder
// (ArrowRowTest compares the two tables).
Status AppendDeltaRow(const OutboxRow& row, ArrowBatch* batch);
// Microseconds since the epoch of an RFC 3339 date-time ("2026-11-30T15:37:13.123456Z", an
// offset instead of Z, 'T', 't' or ' ' between date and time; past six fraction digits cut off);
// nullopt otherwise.
std::optional<int64_t> ParseRfc3339Micros(std::string_view s);

struct LakeWriterOptions {
  std::string database_url;  // libpq URL of oml_lakewriter
  std::string lake_root;     // local path, file:// or s3:// URL; tables at <lake_root>/<name>
  std::string stream = kDefaultStream;
  int64_t max_rows = 10000;                          // rows per batch at most (>= 1)
  std::chrono::milliseconds poll_every{200};         // horizon poll when idle (service mode)
  // Service mode, a horizon probe pending (rows were drawn; their transactions have not all
  // ended): how often it is checked (one round trip, no xid) during its first second; then
  // every poll_every (a long transaction holds it back).
  std::chrono::milliseconds horizon_poll{5};  // (at least 1 ms is used)
  // Service mode: a drain starts at least this long after the last one started (the new probe
  // is taken after the wait, so the batch takes what was committed meanwhile). Each batch costs
  // a Delta commit per table and a frontier transaction, fsyncs on the commit point's disk
  // included, whatever its size: batches back to back at a few hundred events/s would cost the
  // commit point more than they gain in lag. A backlog (a drain of several batches) is not held
  // back. 0: none.
  std::chrono::milliseconds min_batch_interval{150};
  // Service mode: gold/daily_activity (derived from bronze by a MERGE whose fixed cost was more
  // than half of a small batch's CPU) may trail the frontier by this long while batches keep
  // coming: a batch keeps its counts in memory (DailyActivityCounts) and advances the frontier
  // without gold; once the oldest kept count is this old, they are committed alone right after a
  // batch's frontier advance (FlushGold), so no batch waits for gold's MERGE. Gold is also
  // brought to the frontier as soon as the writer finds nothing new to drain, before an outbox
  // prune, and on a graceful stop; after a crash, recovery makes the counts it lacks again from
  // the outbox (step 2). 0: gold commits with every batch, as `--once` always does.
  // docs/data/delta-tables.md "gold/daily_activity trails the frontier".
  std::chrono::milliseconds gold_every{10000};
  std::chrono::milliseconds standby_poll{500};       // lease poll while standby
  std::chrono::milliseconds once_horizon_wait{60000};  // --once: wait this long for a stable horizon
  std::chrono::milliseconds max_backoff{10000};      // after repeated errors
  // While idle (service mode): how often every table is refreshed to find one emptied by
  // `oml lake rebuild` (lake/rebuild.h), replaced, or damaged; such a table sends the writer to
  // recovery, which refills it. 0: never (a table is then noticed at its next commit).
  std::chrono::milliseconds table_check_every{5000};
  // --once: give up after this many consecutive failed attempts (a retryable error each).
  int once_max_attempts = 5;
  // TEST ONLY (`oml lakewriter --test-bypass-lease`): do not take the lease, and advance the
  // frontier without the epoch fence, so that two writers run at once on purpose and the Delta
  // conflict is the only fence left (tests/test_lakewriter.py). Never in a deployment.
  bool bypass_lease = false;
  std::string holder;  // written to lake_frontier.lease_holder; default host:pid:random
  // Dead letters: a row refused this many times in a row (an unknown target table, row_data that
  // does not fit its table) is moved to dead_letter with a signed materialize-skipped event
  // (lake/dead_letter.h), signed with this key (not owned; must be the key in force). Without a
  // key a poison row stops the writer (retried with backoff, logged), and nothing is skipped.
  int dead_letter_after = 3;
  const crypto::SigningKey* signing_key = nullptr;
  // Where the deployment's signing key lives (Config::signing_key_file). Set, the writer re-reads
  // it when a dead letter is refused because its key is no longer the key in force (`oml key
  // rotate` installs the new key there): a rotation reaches a running writer without a restart.
  // The key read replaces signing_key from then on.
  std::string signing_key_file;
  bool allow_insecure_key_files = false;
  // Compaction: after every `compact_every` commits to a table (0: never), the table is
  // OPTIMIZEd (DeltaTable::Optimize, files below compact_target_bytes bin-packed). bronze/events
  // (append only, one row per event) is compacted by a Compactor (lake/compactor.h) on its own
  // thread and table handles, so batches go on meanwhile; `--once` waits for those compactions
  // before it returns. The MERGE tables (silver, gold: a row per key) are compacted after the
  // batch's frontier advance, on the batch path, since each batch's MERGE would make a concurrent
  // OPTIMIZE lose. bronze's compactions use two tiers (Compactor::Options: compact_target_bytes
  // / 8, at least 1 MiB; compact_target_bytes once eight files lie between the two), so no run
  // rewrites the whole table. The count of commits starts, in each process, from the table's
  // files below the target it compacts, so restarts do not postpone compaction. Files per table
  // stay below about 2 x compact_every (the commits made while a compaction runs) + 8 + the
  // table's size / the target. Removed files remain until a
  // VACUUM (vacuum_every below). Only a writer that holds the lease compacts (never
  // with bypass_lease), and no OPTIMIZE lands over another rewrite of the files it read
  // (DeltaTable::Optimize, "lake-rewrite-stale"; docs/data/delta-tables.md "Compaction").
  int compact_every = 100;
  uint64_t compact_target_bytes = uint64_t{128} << 20;
  // VACUUM (issue 20, "The lake's upkeep"): every `vacuum_every` (0: never) a writer holding the
  // lease VACUUMs each table between batches (DeltaTable::Vacuum, full mode): data files that
  // compaction, MERGEs and rebuilds removed from the log more than `vacuum_retention_hours` ago,
  // and files no commit names older than that (a killed writer's), are deleted. A reader of any
  // version committed within the retention still finds every file it names (time travel to it
  // works); the retention is at least 1 hour (a writer's uncommitted files are younger) and at
  // most 168 (a checkpoint drops tombstones older than the tables' deletedFileRetentionDuration,
  // 7 days, after which VACUUM could no longer tell a removed file's age). The first VACUUM runs a
  // minute after the writer starts (or one `vacuum_every`, if shorter). Checkpoints need nothing here:
  // every commit writes one each delta.checkpointInterval (10) versions. Expired log files
  // (delta.logRetentionDuration, 30 days) are removed by each VACUUM round and by OPTIMIZE's
  // commits only: the batch commits skip delta-rs's cleanup, which lists the whole log
  // (docs/data/delta-tables.md).
  std::chrono::seconds vacuum_every{6 * 3600};
  int64_t vacuum_retention_hours = 7 * 24;
  // Outbox pruning (issue 20, sql/0025): every `prune_every` (0: never) a writer holding the lease
  // deletes outbox rows at or below the frontier enqueued more than `outbox_retention_hours` ago
  // (0: every row at or below the frontier), `prune_batch` rows per transaction, until none is due
  // or prune_max_batches transactions ran; `--once` prunes once after it drained. Never while a
  // table is behind what it committed. A table later found behind below what was pruned is
  // re-derived from the journal (RederiveTable; lake/rederive.h) before its refill from the outbox.
  std::chrono::seconds prune_every{300};
  int64_t outbox_retention_hours = 7 * 24;
  int prune_batch = 10000;
  int prune_max_batches = 100;
  // While a batch is applied, read the next one (up to max_rows more rows of the same stable
  // horizon) on a second connection, so that reading PostgreSQL and writing Delta overlap.
  bool prefetch = true;
};

// What a writer has done so far (for tests and logs).
struct LakeWriterStats {
  int64_t batches = 0;            // batches whose frontier advance succeeded
  int64_t rows = 0;               // rows committed to Delta tables (all tables together)
  std::map<std::string, int64_t> rows_by_table;  // the same, per table
  int64_t commits = 0;            // Delta commits written
  int64_t skipped_tables = 0;     // table parts skipped by the txn check
  int64_t conflicts = 0;          // commits lost (lake-commit-conflict): to another writer, or a compaction
  int64_t recovered_batches = 0;  // batches rebuilt from a table ahead of the frontier
  int64_t refilled_batches = 0;   // batches applied again to a table behind what it committed
  int64_t lease_acquisitions = 0;
  int64_t rows_pruned = 0;        // outbox rows this writer pruned
  int64_t rederived_tables = 0;   // tables re-derived from the journal
  int64_t rederived_rows = 0;     // rows those re-derivations committed
  int64_t refused_rows = 0;       // attempts refused for a poison row (each counts)
  int64_t dead_letters = 0;       // rows moved to dead_letter
  int64_t compactions = 0;        // OPTIMIZE commits written (by the compactor thread)
  // OPTIMIZE attempts the adapter refused because a newer rewrite (an operator's OPTIMIZE, say)
  // had removed files they read ("lake-rewrite-stale"; nothing committed).
  int64_t refused_compactions = 0;
  int64_t compactions_without_lease = 0;  // compactor requests dropped: the lease was gone
  int64_t retried_commits = 0;    // commits lost to a compaction and written again at once
  int64_t prefetched_cuts = 0;    // batches whose cut was read while the one before was applied
  int64_t gold_trailed = 0;       // batches whose gold counts were kept for a later commit (gold_every)
  int64_t gold_flushes = 0;       // gold commits of kept counts alone (FlushGold)
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
  LakeWriterStats stats() const;
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
  // A row the tables refuse (see LakeWriterOptions::dead_letter_after).
  struct Poison {
    const OutboxRow* row = nullptr;
    std::string error;
  };
  // Steps 4 to 7 for one batch (a new cut or a rebuilt one), leaving out dead-lettered rows;
  // a poison row is counted, and past the budget dead-lettered and the batch applied without it.
  Status ApplyBatch(const Batch& b);
  // While idle: every table refreshed; kAborted "lake-table-behind" if one moved back below what
  // this writer knows it holds (emptied by a rebuild, replaced), or its log is damaged.
  Status CheckTables();
  // VACUUMs every table when vacuum_every has passed since the last (see LakeWriterOptions).
  void MaybeVacuum();
  // Prunes the outbox when prune_every has passed since the last, or at once if `now` (see
  // LakeWriterOptions), after gold holds every row up to the frontier (FlushGold: its error is
  // returned). The prune's failures are logged, not returned: the next round tries again.
  Status MaybePrune(bool now);
  // Empties `target` and commits the rows it held from the pruned prefix of the outbox, re-derived
  // from the journal (lake/rederive.h), in chunks of max_rows: txn 1, 2, ... and the last one
  // marks.pruned_through. A writer stopped midway leaves a txn below its record: the next
  // recovery finds the table behind and starts again (the table is emptied first every time).
  // REQUIRES: the lease (the journal feed checks its epoch).
  Status RederiveTable(const TargetTable& target, const PruneMarks& marks);
  // Table(name), refreshed; damaged commits at the head of its log are set aside first
  // (SetAsideDamagedHead), under the lease, by recovery only.
  Result<DeltaTable*> RecoverTable(const std::string& name);
  // The tables that already hold `row` (a dead letter's applied_tables, sql/0019): the tables it
  // feeds whose Delta txn of this stream is at or past its seq, and those its requeue skipped.
  Result<std::vector<std::string>> TablesHolding(const OutboxRow& row);
  // One attempt at steps 4 to 7 without the rows in `dead`. A poison row stops it before the
  // commit of its table: *poison is set and OK returned. Found converting, the tables before it
  // in the registry are committed first; found by a MERGE's refusal, the other tables of that
  // round have committed. The touched tables' commits run at once (commit_pool_); a failed
  // batch may leave any of them committed.
  Status ApplyParts(const Batch& b, const DeadLetters& dead, std::optional<Poison>* poison);
  struct Part;
  // Step 6 for one table: its conditional commit, into p->version and p->secs. Touches only *p
  // and its table handle (runs on a commit_pool_ thread beside the others of the round).
  void CommitPart(const Batch& b, Part* p);
  // Counts an attempt; past the budget moves the row to dead_letter (true), *applied then the
  // tables that hold it (TablesHolding). false: not yet.
  Result<bool> HandlePoison(const Poison& p, std::vector<std::string>* applied);
  // Step 7, and each committed table's recorded txn (sql/0018) in the same statement.
  Status AdvanceFrontier(int64_t batch_end, const std::vector<std::string>& committed);
  // What `table` must already hold (lake_table_txn, as of the last Recover and this writer's
  // advances); -1 if nothing was ever recorded.
  int64_t RecordedTxn(const std::string& table) const {
    auto it = recorded_txn_.find(table);
    return it == recorded_txn_.end() ? -1 : it->second;
  }
  // One session of work: connect, lease, recover, then drain (once: to once_target_).
  Status Session(const std::atomic<bool>* stop, bool once);
  // Steps 3 to 7 until the frontier reaches `horizon`, the next batch cut on reader_ while one
  // is applied (LakeWriterOptions::prefetch).
  Status DrainTo(int64_t horizon, const std::atomic<bool>* stop);
  Status EnsureReader();
  // Counts a commit to `table` and compacts it when compact_every is reached, if this process
  // holds the lease (never with bypass_lease). Failures are logged, not returned: the next
  // commit tries again.
  void MaybeCompact(const std::string& table);
  // bronze's small compaction tier (Compactor::Options::small_target_bytes):
  // compact_target_bytes / 8, at least 1 MiB, at most compact_target_bytes.
  uint64_t CompactorSmallTarget() const;
  // lease_held_ and, for the compactor's thread, compaction_lease_.
  void SetLeaseHeld(bool held);
  // What the compactor's thread checks before each OPTIMIZE (Compactor::Options::lease_check):
  // epoch is this writer's lease epoch while it believes it holds the lease, else 0 (set by the
  // writer's thread); Check also reads lake_frontier.lease_epoch on a connection of its own
  // (compactor thread only), so a lease another process took over stops the compaction even
  // before this writer notices.
  struct CompactionLease {
    std::atomic<int64_t> epoch{0};
    std::string database_url, stream;
    std::unique_ptr<db::Conn> conn;  // compactor thread only
    Status Check();
  };
  // Sets the lag gauges (common/metrics.h LakeLag) from the outbox.
  Status PublishLag();
  Status Loop(const std::atomic<bool>* stop, bool once);
  // Commits the counts gold trails by (gold_pending_) with txn = the frontier, and records it
  // (lake_table_txn). A gold txn found other than the one the counts sit on: kAborted
  // "lake-gold-moved" (recovery refills gold from the outbox). gold_pending_ is empty after it,
  // whatever the result.
  Status FlushGold();
  // Whether a batch leaves gold's part for later (service mode with opts_.gold_every > 0, not
  // while Recover refills).
  bool GoldMayTrail() const;
  // Whether gold's kept counts are due (the oldest is opts_.gold_every old): FlushGold.
  bool GoldDue() const;

  LakeWriterOptions opts_;
  OutboxStream stream_;
  std::string app_id_;
  std::unique_ptr<db::Conn> conn_;
  std::unique_ptr<db::Conn> reader_;  // reads the next cut while a batch is applied (no lease)
  std::map<std::string, DeltaTable> tables_;
  // Commits a batch's tables beside the writer's thread (ApplyParts); made on first use by the
  // writer's thread, so its threads have that thread's nice value. Declared after tables_: its
  // threads are joined before the handles go.
  std::unique_ptr<WorkPool> commit_pool_;
  bool lease_held_ = false;
  int64_t epoch_ = 0;
  int64_t frontier_ = 0;
  std::optional<int64_t> once_target_;
  std::map<int64_t, int> refusals_;  // outbox seq -> attempts refused so far (this process)
  // by table: commits since the last compaction request; a table's first entry in a process is
  // seeded from its snapshot (MaybeCompact)
  std::map<std::string, int> commits_since_compaction_;
  std::map<std::string, int64_t> recorded_txn_;           // table -> lake_table_txn.txn_version
  // While a refill runs: the point the behind tables are refilled up to (lag counts from it).
  std::optional<int64_t> behind_from_;
  // True while Recover refills (its batches are ordered from the lowest behind txn up, and a
  // table is committed to only above its own txn): ApplyParts' lake-table-behind check is off.
  bool refilling_ = false;
  // Per table: the highest txn of this stream this process knew the table to hold (its own
  // commits, its reads). A txn found below it means the table lost rows (emptied by `oml lake
  // rebuild`, replaced), whatever lake_table_txn says.
  std::map<std::string, int64_t> txn_seen_;
  // Per table: the version CheckTables last read the txn at.
  std::map<std::string, int64_t> checked_version_;
  // What `table` must hold: its record (sql/0018) or what this process saw it hold.
  int64_t MustHold(const std::string& table) const {
    auto it = txn_seen_.find(table);
    return std::max(RecordedTxn(table), it == txn_seen_.end() ? int64_t{-1} : it->second);
  }
  void SawTxn(const std::string& table, int64_t txn) {
    auto [it, fresh] = txn_seen_.emplace(table, txn);
    if (!fresh) it->second = std::max(it->second, txn);
  }
  // Per table: (table version, this stream's txn version at it) of this writer's last commit or
  // txn read; {-1, -1} until the first. While the handle's snapshot is still at that version,
  // the txn check needs no refresh and no log read (the snapshot's txn lookup replays the log
  // since the last checkpoint).
  struct KnownTxn {
    int64_t table_version = -1;
    int64_t txn = -1;  // this stream's txn version at it
  };
  std::map<std::string, KnownTxn> txn_cache_;
  // gold/daily_activity's counts of the bronze rows (above, through] that gold does not hold yet
  // (opts_.gold_every): `above` is gold's txn, `through` the frontier; `since` when the oldest
  // count was kept. Set only after a batch's frontier advance; cleared when gold's commit lands,
  // by FlushGold, and by Recover (which makes them again from the outbox instead).
  struct GoldPending {
    DailyActivityCounts counts;
    int64_t above = -1;
    int64_t through = -1;
    std::chrono::steady_clock::time_point since{};
  };
  std::optional<GoldPending> gold_pending_;
  bool gold_may_trail_ = false;  // set by Loop in service mode; off in Recover and --once
  LakeWriterStats stats_;
  std::shared_ptr<CompactionLease> compaction_lease_;  // shared with compactor_'s lease_check
  bool warned_no_lease_compaction_ = false;
  // The signing key re-read from LakeWriterOptions::signing_key_file (HandlePoison); null until then.
  std::unique_ptr<crypto::SigningKey> reloaded_key_;
  std::unique_ptr<Compactor> compactor_;  // started at the first request; joins first at destruction
  // When the last VACUUM round ran; unset until the first MaybeVacuum, which schedules the first
  // round a minute later (or one vacuum_every, if shorter): a writer restarted more often than
  // vacuum_every still vacuums.
  std::optional<std::chrono::steady_clock::time_point> vacuumed_at_;
  std::optional<std::chrono::steady_clock::time_point> pruned_at_;  // the last prune round
};

}  // namespace oml::lake
