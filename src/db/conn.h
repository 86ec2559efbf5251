// PostgreSQL access over libpq: a move-only connection, a bounded pool, and a pipeline.
//
// Results come back in text format unless a Stmt asks for binary; bytea columns are decoded with
// GetBytes() either way.
//
// Errors. A failed statement becomes a Status whose code and type follow its SQLSTATE class and
// whose message is oml's own short text: nothing PostgreSQL wrote (its message, DETAIL, HINT,
// constraint and table names, another backend's SQL in a deadlock report) is in message(), so
// nothing of it can reach an API client. All of it is in log_detail(), "[SQLSTATE] <PostgreSQL's
// message>" plus " (constraint <name>)" when the error names one, for the server log.
//
//   SQLSTATE                     code                 type                        message
//   23505 unique violation       kFailedPrecondition  conflict                    the request conflicts with existing data
//   other 23xxx                  kFailedPrecondition  constraint                  the request violates a data constraint
//   40xxx (40001, 40P01)         kAborted             transaction-conflict        ... rolled back; retry
//   42501 privilege / RLS        kInternal            database-permission-denied  (a server bug)
//   OMKEY (revoked API key)      kUnauthenticated     unauthenticated             PL/pgSQL primary message (oml's own)
//   57014 query canceled         kUnavailable         query-canceled              ... retry
//   53xxx resources, 55P03 lock  kUnavailable         database-busy               the database is busy; retry later
//   08xxx, 57Pxx, 25006, lost    kUnavailable         database-unavailable        the database is unavailable; retry later
//   22012 (guarded UPDATE)       kInternal            zero-rows-guard             a guarded statement matched no row
//   anything else                kInternal            (none: internal)            unexpected database error (SQLSTATE x)
#pragma once

#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/status.h"

namespace oml::db {

// Status type of SQLSTATE 22012 (code kInternal): a guarded statement,
// `WITH u AS (UPDATE ... RETURNING 1) SELECT 1/count(*) FROM u`, matched no row.
inline constexpr char kZeroRowsGuard[] = "zero-rows-guard";

// A query parameter: NULL, text, or raw bytes sent in binary format (for bytea).
struct Param {
  std::optional<std::string> value;
  bool binary = false;
};
inline Param Text(std::string v) { return Param{std::move(v), false}; }
inline Param Bytes(std::string raw) { return Param{std::move(raw), true}; }
inline Param Int(int64_t v) { return Param{std::to_string(v), false}; }
inline Param Null() { return Param{std::nullopt, false}; }
// A text[] parameter (use as `$n::text[]`): every element quoted, '"' and '\\' escaped, so any
// element (commas, braces, spaces, "NULL") arrives as itself. Elements must not hold NUL bytes.
std::string TextArrayLiteral(const std::vector<std::string>& elements);
inline Param TextArray(const std::vector<std::string>& elements) { return Text(TextArrayLiteral(elements)); }

// One statement of a pipeline. A statement with a `name` is prepared once per connection (in
// the same pipeline, the first time it is used) and executed as a prepared statement after
// that, which spares the server parsing and planning it on every write. Names must be unique
// per distinct SQL text.
//
// `binary_result` asks for every column in binary format. That spares both sides the hex
// encoding of bytea (half the bytes on the wire); it suits statements whose columns are bytea,
// text-like or integer types only, because Get() then returns the type's binary form (the UTF-8
// text itself for text and varchar; 16 raw bytes for a uuid).
struct Stmt {
  std::string sql;
  std::vector<Param> params;
  std::string name;
  bool binary_result = false;
};

// Scopes the current transaction to `tenant` for row-level security (the setting oml.tenant_id,
// transaction-local), as a statement prepared once per connection.
inline Stmt ScopeTo(const std::string& tenant) {
  return {"SELECT set_config('oml.tenant_id', $1, true)", {Text(tenant)}, "oml_scope"};
}

// A materialized result. Move-only.
class Rows {
 public:
  Rows() = default;
  explicit Rows(PGresult* r) : r_(r, &PQclear) {}
  int size() const { return r_ ? PQntuples(r_.get()) : 0; }
  bool IsNull(int row, int col) const { return PQgetisnull(r_.get(), row, col); }
  std::string Get(int row, int col) const;
  // An integer column. In binary results only int2, int4 and int8 decode; anything else, or
  // NULL, throws std::invalid_argument (as std::stoll does for text that is not a number).
  int64_t GetInt(int row, int col) const;
  // A bytea column as raw bytes (decodes the text format "\x...").
  std::string GetBytes(int row, int col) const;
  // Rows affected by INSERT/UPDATE/DELETE.
  int64_t Affected() const;
  // The command tag ("COMMIT", or "ROLLBACK" for a COMMIT of an aborted transaction).
  std::string CommandTag() const { return r_ ? PQcmdStatus(r_.get()) : ""; }

 private:
  std::unique_ptr<PGresult, void (*)(PGresult*)> r_{nullptr, &PQclear};
};

class Conn {
 public:
  // Connects with a libpq URL or keyword string (connect_timeout 10 s unless it sets one).
  // kUnavailable if the server is unreachable.
  // Every connection then runs `SET lc_messages = 'C'`, so server messages are English whatever
  // the server's default. lc_messages is superuser-only; `oml migrate` grants it to oml_app
  // (db/migrate.h). Where the SET is refused (a role without that grant), the connection is
  // still returned and a warning logged once: nothing oml decides depends on message text.
  static Result<Conn> Connect(const std::string& url);
  Conn(Conn&&) noexcept = default;
  Conn& operator=(Conn&&) noexcept = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Simple-protocol execution; may contain several statements. Returns the last result.
  Result<Rows> Exec(const std::string& sql);
  // Extended protocol with parameters.
  Result<Rows> Query(const std::string& sql, const std::vector<Param>& params = {});
  // Sends all statements in one libpq pipeline and one sync: a single round trip. Returns one
  // Rows per statement, or the first error (statements after a failure are not executed; the
  // caller must roll back an open transaction).
  Result<std::vector<Rows>> Pipeline(const std::vector<Stmt>& stmts);

  // Runs one statement in its own transaction scoped to `tenant` (row-level security setting
  // oml.tenant_id), in one round trip: BEGIN; set_config; stmt; COMMIT. Returns stmt's rows.
  Result<Rows> Scoped(const std::string& tenant, Stmt stmt);

  bool healthy() const;
  // For an idle pooled connection: healthy(), and the server has not hung up on it (a restart,
  // failover or terminated backend). Polls the socket without blocking and consumes what
  // arrived, so a connection whose server end is gone is noticed before a caller uses it.
  bool Alive();
  PGconn* raw() const { return c_.get(); }

  // True if the most recent COMMIT sent on this connection (a COMMIT or END statement, by Exec,
  // Query or Pipeline) may not be acknowledged by the synchronous standbys: the server sent a WARNING
  // while processing it (CommitNoticeRefusesAck). That is how PostgreSQL reports a cancelled
  // wait for synchronous replication, whose commit is local only. Cleared by this call and when
  // the next COMMIT starts. Recognised structurally (by when it arrives and its non-localized
  // severity), never by the message text, which follows lc_messages.
  bool TakeSyncRepWarning() { return notices_->sync_rep_canceled.exchange(false); }
  // The verdict on the result of the COMMIT this connection just ran: kAborted if it answered
  // ROLLBACK; kUnavailable "commit-not-replicated" if its wait for the synchronous standbys was
  // cancelled (committed locally, not durable by the production definition: not to be
  // acknowledged); OK otherwise. Takes the sync-rep warning.
  Status CommitVerdict(const Rows& commit);

 private:
  struct Notices {
    std::atomic<bool> in_commit{false};  // a COMMIT's results are being read
    std::atomic<bool> sync_rep_canceled{false};
  };
  static void OnNotice(void* arg, const PGresult* r);
  explicit Conn(PGconn* c) : c_(c, &PQfinish), notices_(std::make_unique<Notices>()) {}
  std::unique_ptr<PGconn, void (*)(PGconn*)> c_{nullptr, &PQfinish};
  std::unique_ptr<Notices> notices_;  // stable address for the libpq notice receiver
  std::unordered_set<std::string> prepared_;  // statement names prepared on this connection
};

// The rule for a notice received while a COMMIT is processed: true (the commit is not
// acknowledged) for every WARNING, by the non-localized severity (PG_DIAG_SEVERITY_NONLOCALIZED,
// PostgreSQL 9.6+; a missing one counts as a WARNING). A cancelled synchronous-replication wait
// is a WARNING with SQLSTATE 01000 (cancel request) or 57P01 (termination; the connection then
// closes); any other WARNING during COMMIT is unexpected, and refusing the acknowledgement is
// the safe answer to it. NOTICE, INFO, LOG and DEBUG do not count. `sqlstate` may be null.
bool CommitNoticeRefusesAck(const char* severity_nonlocalized, const char* sqlstate);

// The commit wait bound of this process (`commit_replication_timeout_ms`; 0, the default, waits
// for ever). A COMMIT sent by Exec, Query or Pipeline that has not answered `bound` after it
// started (for a pipeline: after the pipeline was sent, see Conn::Pipeline) is cancelled by a watchdog
// thread (PQcancel): PostgreSQL ends a wait for synchronous standbys with a WARNING, so
// CommitVerdict answers kUnavailable "commit-not-replicated" (the commit is local only, never
// acknowledged). If the cancellation is not answered within 10 s either, the watchdog shuts the
// socket down, and the statement fails with that type too (the COMMIT's outcome is unknown; the
// connection is dropped). A cancel that arrives as the COMMIT finishes finds the session idle and
// is ignored; in a pipeline it could cancel a statement after the COMMIT, so keep COMMIT last.
// Thread-safe; read at the start of each COMMIT.
void SetCommitWaitBound(std::chrono::milliseconds bound);
std::chrono::milliseconds CommitWaitBound();

// Maps a failed PGresult (or connection) to a Status as described above.
Status StatusFromResult(const PGresult* r, PGconn* c);

// True iff `s` is a constraint violation (type conflict or constraint) of the named constraint,
// e.g. "idempotency_keys_pkey". Reads the constraint name PostgreSQL reports in its own field
// (PG_DIAG_CONSTRAINT_NAME), never the localized message.
bool IsViolationOf(const Status& s, const std::string& constraint);

// A bounded pool of connections to one URL. Thread-safe.
//
// Fairness: every acquisition belongs to a share, named by the calling thread's innermost live
// Pool::ScopedShare (a tenant id, "auth" for API-key lookups; none outside any scope). A named
// share holds at most its cap of connections at once (by default all but a quarter of the
// pool, and at least one connection less than the pool when it has two or more), so one tenant's readers, or a flood of token lookups, cannot take every
// connection. Acquisitions outside any share are capped only by the pool size.
//
// Deadline: with Options::acquire_timeout > 0, Acquire waits at most that long and then fails
// with kUnavailable, type "database-busy" (HTTP 503 with Retry-After). 0 waits forever (the
// CLI and background tasks).
class Pool {
 public:
  struct Options {
    int size = 16;
    std::chrono::milliseconds acquire_timeout{0};
    int default_share_cap = 0;  // 0: size - max(1, size / 4), at least 1
  };
  Pool(std::string url, int size) : Pool(std::move(url), Options{size}) {}
  Pool(std::string url, Options o);

  // A connection checked out of the pool; returns itself on destruction. Move-only.
  class Handle {
   public:
    Handle(Pool* p, std::unique_ptr<Conn> c, std::string share)
        : pool_(p), conn_(std::move(c)), share_(std::move(share)) {}
    Handle(Handle&& o) noexcept : pool_(o.pool_), conn_(std::move(o.conn_)), share_(std::move(o.share_)) {
      o.pool_ = nullptr;
    }
    Handle& operator=(Handle&&) = delete;
    ~Handle();
    Conn* operator->() { return conn_.get(); }
    Conn& operator*() { return *conn_; }

   private:
    Pool* pool_;
    std::unique_ptr<Conn> conn_;
    std::string share_;
  };

  // Names the share of every acquisition this thread makes while the scope lives; `cap` > 0
  // overrides the pool's default cap for it, and `max_wait` > 0 shortens the pool's deadline
  // for it (the lookups of unknown tokens wait briefly, so that a flood of them does not tie up
  // the server's worker threads). Scopes nest (the innermost wins) and are per-thread: pass
  // nothing across threads.
  class ScopedShare {
   public:
    explicit ScopedShare(std::string share, int cap = 0, std::chrono::milliseconds max_wait = std::chrono::milliseconds(0));
    ~ScopedShare();
    ScopedShare(const ScopedShare&) = delete;
    ScopedShare& operator=(const ScopedShare&) = delete;

   private:
    std::string prev_share_;
    int prev_cap_;
    std::chrono::milliseconds prev_wait_;
  };

  // Waits for a free connection (or opens one) within the share's cap and the deadline.
  // kUnavailable "database-busy" when the deadline passes; kUnavailable if connecting fails.
  Result<Handle> Acquire();
  const std::string& url() const { return url_; }
  int size() const { return opts_.size; }
  // Connections the named share holds now (for tests and metrics).
  int InUse(const std::string& share);

 private:
  void Release(std::unique_ptr<Conn> c, const std::string& share);
  const std::string url_;
  const Options opts_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Conn>> idle_;   // GUARDED_BY(mu_)
  int open_ = 0;                             // GUARDED_BY(mu_)
  std::map<std::string, int> share_in_use_;  // GUARDED_BY(mu_); only nonzero entries
};

// Quotes an identifier / literal with libpq's escaping (for DDL that cannot take parameters).
std::string QuoteIdent(Conn& c, const std::string& s);
std::string QuoteLiteral(Conn& c, const std::string& s);

}  // namespace oml::db
