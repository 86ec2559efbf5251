// The production durability requirement (docs/operations/deployment.md "Durability"), checked
// against the database's own settings, and the write gate `oml serve` builds on it.
//
// The journal's durability claim needs synchronous quorum replication: a COMMIT returns only
// after k standbys hold its WAL, so a failover cannot lose an acknowledged event. In PostgreSQL
// terms both of these must hold, as seen by the application role's own sessions:
//   synchronous_commit         in (remote_write, remote_apply, on): the COMMIT waits for standbys
//   synchronous_standby_names  'ANY k (name, ...)' with k >= 1: a quorum
//
// synchronous_standby_names grammar (PostgreSQL src/backend/replication/syncrep_gram.y and
// syncrep_scanner.l; ANY and FIRST are case-insensitive keywords, a name is an identifier
// [A-Za-z\x80-\xff_][A-Za-z\x80-\xff_0-9$]*, a number, "*", or a "double-quoted" string with ""
// for a quote):
//
//   form                    method     counts as quorum?
//   ''                      none       no: no synchronous standbys at all
//   name [, ...]            priority   no: FIRST 1 (name, ...)
//   k (name [, ...])        priority   no: the pre-9.6 spelling of FIRST k
//   FIRST k (name [, ...])  priority   no
//   ANY k (name [, ...])    quorum     yes, when k >= 1
//
// Only ANY counts because that is what the design declares (storage.md "Durability domain":
// "quorum synchronous standbys"). FIRST k also waits for k standbys, but for the k
// highest-priority ones in list order: which standbys hold the newest WAL is tied to that
// order, and a plain list (the most common misconfiguration) is FIRST 1, one standby. oml does
// not judge which priority setups are equivalent; it accepts the form the design names.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "db/conn.h"

namespace oml::db {

// A parsed synchronous_standby_names.
struct SyncStandbys {
  enum class Method { kNone, kPriority, kQuorum };
  Method method = Method::kNone;
  int num_sync = 0;                 // k; 0 for kNone
  std::vector<std::string> names;   // as written, quotes removed; "*" matches any standby

  bool IsQuorum() const { return method == Method::kQuorum && num_sync >= 1; }
  // "none", "ANY 2 of 3 standbys", "FIRST 1 of 2 standbys", "ANY 1 of any standby (*)": never
  // the names.
  std::string Describe() const;
};

// Parses synchronous_standby_names per the grammar above. An empty (or all-blank) value is
// kNone. kInvalidArgument, type "invalid-sync-standby-names", for anything PostgreSQL's parser
// would reject (including k < 1).
Result<SyncStandbys> ParseSyncStandbyNames(std::string_view value);

// The two settings, as `SHOW` prints them.
struct DurabilitySettings {
  std::string synchronous_commit;
  std::string synchronous_standby_names;
};

struct DurabilityVerdict {
  bool quorum = false;  // the production requirement holds
  // Why, in one sentence without standby names (it is shown unauthenticated in /v1/health),
  // e.g. "synchronous_standby_names is priority-based (FIRST 1 of 1 standby), not a quorum (ANY k)".
  std::string detail;
};

DurabilityVerdict EvaluateDurability(const DurabilitySettings& s);

// The synchronous standbys streaming from the primary now (oml.sync_standbys(),
// sql/0026_sync_standbys.sql) against the number a COMMIT waits for.
struct StandbyCount {
  bool known = false;     // false: the counts could not be read (no pg_read_all_stats, a standby)
  int sync_streaming = 0;  // streaming with sync_state sync or quorum
  int streaming = 0;       // every streaming standby, asynchronous ones included
  int required = 0;        // k of synchronous_standby_names (0: none configured)

  // A quorum is configured, the counts are known, and fewer than k synchronous standbys stream:
  // every COMMIT waits (up to commit_replication_timeout_ms, then 503 commit-not-replicated).
  bool BelowQuorum() const { return known && required > 0 && sync_streaming < required; }
  // The /v1/health value: "ok", "below-quorum", "unknown", or "none" (no synchronous standbys
  // configured).
  std::string HealthValue() const;
  // "1 of 2 standbys streaming synchronously; ANY 1 needed", without names.
  std::string Describe() const;
};

// Reads the counts on `c` (a connection of the application role) for `settings`.
// A database where the function is missing or unreadable gives known = false, not an error.
StandbyCount ReadStandbyCount(Conn& c, const DurabilitySettings& settings);

// Reads the settings on `c`. Use a connection of the application role: synchronous_commit can
// differ per role and database (ALTER ROLE ... SET), and the application's commits are the ones
// that count.
Result<DurabilitySettings> ReadDurabilitySettings(Conn& c);

// How `oml serve` treats the requirement.
enum class DurabilityMode {
  kEnforced,      // production: writes are refused (503 durability-reduced) while it does not hold
  kReduced,       // --reduced-durability / reduced_durability: writes accepted, reported as reduced
  kReducedLocal,  // the local profile (`oml dev`): reduced by definition
};

// The durability write gate of one server process: checks the settings at Start() and then
// every `interval` on a background thread, so a change of the database's settings opens or
// closes the gate within one interval. Reports every check to the metrics
// (oml_durability_reduced, oml_durability_quorum) and logs the startup state and every change.
// Thread-safe.
class DurabilityMonitor {
 public:
  // `url`: the application role's database URL. The monitor checks on a connection of its own,
  // so a pool exhausted by writes waiting for standbys cannot delay the check.
  DurabilityMonitor(std::string url, DurabilityMode mode, std::chrono::milliseconds interval);
  ~DurabilityMonitor();  // Stop()
  DurabilityMonitor(const DurabilityMonitor&) = delete;
  DurabilityMonitor& operator=(const DurabilityMonitor&) = delete;

  // The first check (synchronously; its error is returned, nothing is started), the startup log
  // line, then the background thread.
  Status Start();
  void Stop();
  // One check now. A check that cannot read the settings counts as "requirement not met".
  // It also counts the synchronous standbys streaming: fewer than the quorum is logged (an error
  // when it starts, info when it ends), shown in /v1/health ("replication") and the metrics, but
  // does not close the gate: a COMMIT then waits for a standby to return, up to
  // commit_replication_timeout_ms, and is never acknowledged without one.
  Status CheckNow();

  // OK when writes may be acknowledged: the mode is reduced, or the last check found quorum
  // sync. Otherwise kUnavailable, type "durability-reduced".
  Status Gate() const;

  struct State {
    DurabilityMode mode;
    bool checked = false;  // at least one check ran
    bool quorum = false;   // the last check found the requirement met
    std::string detail;    // the last check's DurabilityVerdict::detail (or its error)
    StandbyCount standbys;  // the last check's count (reported, not a gate: see CheckNow)
  };
  State Get() const;

  // The /v1/health value: "ok" (enforced, requirement met), "insufficient" (enforced, not met:
  // writes refused), "reduced", or "reduced (local profile)".
  static std::string HealthValue(const State& s);

 private:
  void Loop();

  const std::string url_;
  const DurabilityMode mode_;
  const std::chrono::milliseconds interval_;
  mutable std::mutex mu_;
  State state_;  // GUARDED_BY(mu_)
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
  std::mutex check_mu_;         // one check at a time
  std::unique_ptr<Conn> conn_;  // GUARDED_BY(check_mu_)
};

}  // namespace oml::db
