// The outbox cut (D2, protocol step 1): which outbox rows the lake writer may take, exactly.
//
// Outbox seqs are drawn by transactions of different tenants that are not serialized, so a
// smaller seq can become visible after a larger one was read. "The rows I can see" is never a
// batch, and neither is "rows whose xid is below the snapshot's xmin" (ARCHITECTURE.md "The
// outbox cut" gives the counter-example; src/lake/outbox_cut_pg_test.cc replays it). The rule
// used here is exact:
//
//   1. read L = the stream sequence's last value (non-transactional: every seq drawn so far,
//      committed or not, is <= L);
//   2. then, in a separate short transaction, take X = pg_current_xact_id(). oml.enqueue_outbox
//      takes its transaction's xid BEFORE it draws a seq, so every transaction holding a
//      seq <= L got its xid before L was read, hence before X: its xid is < X;
//   3. L is a stable horizon once pg_snapshot_xmin(pg_current_snapshot()) >= X: no transaction
//      with an xid below X is still running, so no row with seq <= L can appear any more.
//
// Never wait for pg_snapshot_xip() to drain instead of comparing xmin with X: a running
// transaction whose xid is >= the snapshot's xmax is not listed in it. A long transaction holds
// the horizon back: that is frontier lag, never loss, and HorizonHolders() names it.
//
// A batch is (frontier, batch_end] with batch_end <= a stable horizon; size chooses batch_end
// inside the stable prefix (CutBatch), and a retry or a recovery rebuilds the same batch by
// seq range (ReadRange), never by cutting again.
//
// Roles: every function here runs as oml_lakewriter (sql/0008_lakewriter.sql: it reads every
// tenant's outbox rows and the sequence's last value, and draws no seq) or as a superuser.
// Thread safety: none of these keep state except HorizonTracker, which is not thread-safe; a
// db::Conn is used by one thread at a time.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "db/conn.h"

namespace oml::lake {

// An outbox stream: its own sequence, horizon, frontier (oml.lake_frontier row), lease and
// Delta appId. One stream exists today, "default" (oml.outbox and oml.outbox_seq); a deployment
// sharded by tenant adds streams by configuration and migration, not by rewriting this code.
struct OutboxStream {
  std::string name;      // [a-z0-9][a-z0-9_-]{0,62}
  std::string table;     // qualified outbox table, from the registry below (never from input)
  std::string sequence;  // qualified sequence of its seqs (CACHE 1)
};

inline constexpr char kDefaultStream[] = "default";

// The registry of streams. kInvalidArgument "invalid-field" for a malformed name; kNotFound
// "unknown-stream" for a well-formed name this binary has no stream for.
Result<OutboxStream> ResolveStream(std::string_view name);

// The Delta txn appId of a stream's writer: "oml-lakewriter" for "default",
// "oml-lakewriter-<stream>" for every other stream.
std::string AppIdFor(std::string_view stream);

// One outbox row, as the writer reads it.
struct OutboxRow {
  int64_t seq = 0;
  std::string tenant_id;     // uuid text
  uint64_t xid = 0;          // xid8 of the inserting transaction
  std::string target_table;  // "bronze/events", ...
  int64_t journal_seq = 0;   // seq of the journal event on the tenant's chain
  std::string row_data;      // the jsonb document, as PostgreSQL prints it
  std::string enqueued_at;   // timestamptz text
  // A requeued row only (sql/0019): tables that already hold it, which it must not be applied to.
  std::vector<std::string> skip_tables;
  bool Skips(const std::string& table) const {
    return !skip_tables.empty() && std::find(skip_tables.begin(), skip_tables.end(), table) != skip_tables.end();
  }
};

// The elements of array_to_string(text[], ','): lake table names, which hold no comma ("" -> none).
std::vector<std::string> SplitTableList(const std::string& list);

// Steps 1 and 2 of the rule: L and X.
struct HorizonProbe {
  int64_t candidate = 0;  // L: the sequence's last value (0 before the first seq is drawn)
  uint64_t fence_xid = 0;  // X: an xid assigned after L was read (its transaction has ended)
};

// Reads L, then takes X in its own (autocommit) transaction: two round trips, in that order.
// REQUIRES: `c` is not inside a transaction (kFailedPrecondition "transaction-open" otherwise:
// X's transaction must end, or it would hold the horizon back itself).
Result<HorizonProbe> ProbeHorizon(db::Conn& c, const OutboxStream& s);

// ProbeHorizon for readers that must not take an xid (`oml status`, polled by monitors: an xid
// per call would burn xids and push the cluster toward anti-wraparound vacuums). X is not a new
// xid but one past every xid assigned before the probe's second round trip: the snapshot's xmax,
// or one past the newest running xid at or above it (pg_locks). IsStable and HorizonHolders take
// the result as they take ProbeHorizon's. REQUIRES: as ProbeHorizon.
Result<HorizonProbe> ProbeHorizonWithoutXid(db::Conn& c, const OutboxStream& s);

// Step 3: true iff pg_snapshot_xmin(pg_current_snapshot()) >= probe.fence_xid, i.e. every
// seq <= probe.candidate is final (committed and visible to any later snapshot, or never
// committed). One round trip; assigns no xid.
Result<bool> IsStable(db::Conn& c, const HorizonProbe& probe);

// Probes, then polls IsStable every `poll_every` until it holds or `max_wait` has passed.
// Returns probe.candidate if it became stable, else `previous` (the newest stable horizon the
// caller already knows: the horizon never goes back). Never an error for waiting too long.
Result<int64_t> StableHorizon(db::Conn& c, const OutboxStream& s, int64_t previous, std::chrono::milliseconds max_wait,
                              std::chrono::milliseconds poll_every = std::chrono::milliseconds(20));

// L: the stream sequence's last value (0 before its first draw).
Result<int64_t> LastSeq(db::Conn& c, const OutboxStream& s);

// The non-blocking form for the writer's loop: keeps one probe pending across calls, so a long
// transaction costs one probe (one xid), not one per loop. Not thread-safe.
class HorizonTracker {
 public:
  explicit HorizonTracker(OutboxStream s, int64_t stable = 0) : stream_(std::move(s)), stable_(stable) {}

  // Without a pending probe, starts one only if the sequence drew a seq above the stable
  // horizon (a probe takes an xid; an idle writer spends none). Then, if the pending probe is
  // stable, its candidate becomes the stable horizon. Returns the stable horizon, which never
  // decreases. REQUIRES: as ProbeHorizon.
  Result<int64_t> Poll(db::Conn& c);

  int64_t stable() const { return stable_; }
  // The probe waiting for its xmin (nullopt between probes): HorizonHolders takes it.
  const std::optional<HorizonProbe>& pending() const { return pending_; }
  // When the pending probe was taken (meaningless without one).
  std::chrono::steady_clock::time_point pending_since() const { return pending_since_; }
  const OutboxStream& stream() const { return stream_; }

 private:
  OutboxStream stream_;
  int64_t stable_;
  std::optional<HorizonProbe> pending_;
  std::chrono::steady_clock::time_point pending_since_{};
};

// The outbox rows with from_exclusive < seq <= to_inclusive, ascending by seq, every tenant's.
// The one reader of a batch's rows: a cut (CutBatch) and a recovery rebuild from the bounds a
// Delta commit recorded read the same range the same way. REQUIRES: to_inclusive <= a stable
// horizon (then the result never changes, except by pruning below the frontier). Seqs may have
// gaps (a rolled-back transaction's seq is never reused). kInvalidArgument if
// from_exclusive > to_inclusive or from_exclusive < 0.
Result<std::vector<OutboxRow>> ReadRange(db::Conn& c, const OutboxStream& s, int64_t from_exclusive, int64_t to_inclusive);

// A batch: its bounds and its rows (exactly ReadRange(frontier, batch_end)).
struct Cut {
  int64_t frontier = 0;   // exclusive
  int64_t batch_end = 0;  // inclusive; == frontier: nothing to cut
  std::vector<OutboxRow> rows;
};

// Step 1: cuts (frontier, batch_end] inside the stable prefix. batch_end is the seq of the
// max_rows-th row after the frontier when there are that many up to `stable_horizon`, else
// `stable_horizon` itself (rows may then be empty: a range of rolled-back seqs still advances
// the frontier). When frontier >= stable_horizon the cut is empty with batch_end == frontier.
// Time limits are the caller's: it decides when to call. REQUIRES: stable_horizon came from
// IsStable/StableHorizon/HorizonTracker for this stream; max_rows >= 1 (kInvalidArgument).
Result<Cut> CutBatch(db::Conn& c, const OutboxStream& s, int64_t frontier, int64_t stable_horizon, int64_t max_rows);

// The stream's frontier (oml.lake_frontier.frontier_seq). kNotFound "unknown-stream" if the
// stream has no row.
Result<int64_t> ReadFrontier(db::Conn& c, const OutboxStream& s);

// A transaction that holds a probe's horizon back (for `oml status`): it is running and its xid
// is below the probe's X. Backends of other roles show xact_start, query_start and state only
// to a member of pg_read_all_stats (db::Migrate grants it to oml_lakewriter when it can);
// otherwise those are nullopt/empty.
struct HorizonHolder {
  uint64_t xid = 0;                  // the running xid (xid8) below X
  int64_t xid_age = 0;               // transactions begun since (age(xid))
  std::optional<int> pid;            // nullopt for a prepared transaction (gid is set)
  std::string gid;                   // a prepared transaction's gid, else empty
  std::string role;                  // the backend's (or prepared transaction's) role
  std::string application_name;
  std::string state;                 // "idle in transaction", "active", ... (empty if unknown)
  std::optional<double> xact_age_s;  // now() - xact_start (or prepared), in seconds
  std::optional<std::string> xact_start;
  std::optional<std::string> query_start;
};

// The running transactions with an xid below probe.fence_xid, oldest first (empty once the probe
// is stable), found by the lock each running xid holds on itself (pg_locks), so also those at or
// above the snapshot's xmax. A subtransaction's xid is reported through its top-level backend.
Result<std::vector<HorizonHolder>> HorizonHolders(db::Conn& c, const HorizonProbe& probe);

}  // namespace oml::lake
