#include "db/conn.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/log.h"

namespace oml::db {

std::string TextArrayLiteral(const std::vector<std::string>& elements) {
  std::string out = "{";
  for (size_t i = 0; i < elements.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char ch : elements[i]) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    out += '"';
  }
  out += '}';
  return out;
}
namespace {

int HexVal(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A COMMIT (or END, or COMMIT PREPARED) among the ;-separated statements of `sql`. Text
// inside literals may be split too: a false match only makes the check stricter.
bool IsCommit(const std::string& sql) {
  size_t i = 0;
  while (i < sql.size()) {
    while (i < sql.size() && std::isspace(static_cast<unsigned char>(sql[i]))) ++i;
    size_t j = i;
    while (j < sql.size() && std::isalpha(static_cast<unsigned char>(sql[j]))) ++j;
    std::string word = sql.substr(i, j - i);
    for (auto& ch : word) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (word == "COMMIT" || word == "END") return true;
    i = sql.find(';', j);
    if (i == std::string::npos) break;
    ++i;
  }
  return false;
}

// The bound set by SetCommitWaitBound, in milliseconds (0: none).
std::atomic<int64_t> g_commit_wait_bound_ms{0};

// How long a cancelled COMMIT may take to answer before its connection is cut.
constexpr std::chrono::milliseconds kCancelGrace{10000};

// Cancels COMMITs that outlive the bound, from a thread of its own: the thread that sent the
// COMMIT is blocked in libpq (PQexec, PQgetResult) until the server answers. PQcancel is made for
// this (thread-safe, its own connection). A cancelled COMMIT that still has not answered
// kCancelGrace later has its socket shut down, so the blocked call returns.
class CommitWatchdog {
 public:
  enum Fired { kNone = 0, kCancelled = 1, kCut = 2 };

  static CommitWatchdog& Get() {
    static CommitWatchdog* w = new CommitWatchdog();  // never destroyed: its thread runs for ever
    return *w;
  }

  // Watches the statement now running on `c` for `bound`. Returns the id for Disarm.
  uint64_t Arm(PGconn* c, std::chrono::milliseconds bound) {
    Entry e{std::shared_ptr<PGcancel>(PQgetCancel(c), [](PGcancel* p) { if (p) PQfreeCancel(p); }), PQsocket(c),
            std::chrono::steady_clock::now() + bound, kNone};
    std::lock_guard<std::mutex> l(mu_);
    const uint64_t id = next_++;
    entries_.emplace(id, e);
    cv_.notify_one();
    return id;
  }

  // Stops watching. After it returns the watchdog no longer touches the connection. Returns what
  // it did to the statement.
  Fired Disarm(uint64_t id) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return kNone;
    const Fired f = it->second.fired;
    entries_.erase(it);
    return f;
  }

 private:
  struct Entry {
    std::shared_ptr<PGcancel> cancel;  // shared with a PQcancel in flight
    int sock;
    std::chrono::steady_clock::time_point deadline;
    Fired fired;
  };

  CommitWatchdog() { std::thread([this] { Loop(); }).detach(); }

  // PQcancel opens a connection to the server and may block (an unreachable host): it runs
  // without the lock, so Arm and Disarm never wait for it. The PGcancel outlives a Disarm that
  // races it (shared_ptr); the cancel may then reach the session after the COMMIT answered, where
  // PostgreSQL ignores it if idle (a statement sent after it in the same pipeline would fail with
  // 57014, never commit). The socket shutdown stays under the lock: after Disarm the descriptor
  // may belong to something else.
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      auto next = std::chrono::steady_clock::time_point::max();
      const auto now = std::chrono::steady_clock::now();
      std::vector<std::shared_ptr<PGcancel>> to_cancel;
      for (auto& [id, e] : entries_) {
        if (e.fired == kCut) continue;
        if (e.deadline <= now) {
          if (e.fired == kNone) {
            to_cancel.push_back(e.cancel);
            e.fired = kCancelled;
            e.deadline = now + kCancelGrace;
          } else {
            log::Error("a cancelled COMMIT did not answer; closing its connection", {});
            if (e.sock >= 0) ::shutdown(e.sock, SHUT_RDWR);
            e.fired = kCut;
            continue;
          }
        }
        next = std::min(next, e.deadline);
      }
      if (!to_cancel.empty()) {
        l.unlock();
        for (const auto& cancel : to_cancel) {
          log::Warn("a COMMIT waited longer than commit_replication_timeout_ms for the synchronous standbys; "
                    "cancelling its wait (the commit is not acknowledged)",
                    {{"bound_ms", g_commit_wait_bound_ms.load()}});
          char err[256] = {0};
          if (cancel == nullptr || PQcancel(cancel.get(), err, sizeof err) != 1)
            log::Warn("cancel request failed", {{"error", std::string(err)}});
        }
        l.lock();
        continue;  // entries may have changed meanwhile
      }
      if (next == std::chrono::steady_clock::time_point::max()) cv_.wait(l);
      else cv_.wait_until(l, next);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;  // GUARDED_BY(mu_)
  uint64_t next_ = 1;                  // GUARDED_BY(mu_)
};

Status NotReplicatedCut() {
  return Unavailable("the commit was not confirmed by the synchronous standbys, and the database did not answer its "
                     "cancellation; its outcome must be checked before retrying",
                     "commit-not-replicated");
}

bool ResultOk(const PGresult* r) {
  auto s = PQresultStatus(r);
  return s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK || s == PGRES_SINGLE_TUPLE ||
         s == PGRES_PIPELINE_SYNC;
}

struct ParamArrays {
  std::vector<const char*> values;
  std::vector<int> lengths;
  std::vector<int> formats;
  explicit ParamArrays(const std::vector<Param>& ps) {
    for (const auto& p : ps) {
      values.push_back(p.value ? p.value->data() : nullptr);
      lengths.push_back(p.value ? static_cast<int>(p.value->size()) : 0);
      formats.push_back(p.binary ? 1 : 0);
    }
  }
};

}  // namespace

std::string Rows::Get(int row, int col) const {
  return std::string(PQgetvalue(r_.get(), row, col), PQgetlength(r_.get(), row, col));
}

int64_t Rows::GetInt(int row, int col) const {
  if (PQfformat(r_.get(), col) == 0) return std::stoll(Get(row, col));
  // Binary: big-endian two's complement of the column's width (int2, int4 or int8 only).
  const auto* v = reinterpret_cast<const unsigned char*>(PQgetvalue(r_.get(), row, col));
  const int n = PQgetlength(r_.get(), row, col);
  const Oid type = PQftype(r_.get(), col);
  if (PQgetisnull(r_.get(), row, col) || (type != 20 && type != 21 && type != 23))  // int8, int2, int4
    throw std::invalid_argument("GetInt: column " + std::to_string(col) + " is NULL or not an integer (type oid " +
                                std::to_string(type) + ")");
  uint64_t u = 0;
  for (int i = 0; i < n; ++i) u = (u << 8) | v[i];
  if (n < 8 && n > 0 && (v[0] & 0x80)) u |= ~uint64_t{0} << (8 * n);  // sign-extend int2/int4
  return static_cast<int64_t>(u);
}

std::string Rows::GetBytes(int row, int col) const {
  const char* v = PQgetvalue(r_.get(), row, col);
  size_t n = PQgetlength(r_.get(), row, col);
  if (PQfformat(r_.get(), col) == 1) return std::string(v, n);
  std::string out;
  if (n >= 2 && v[0] == '\\' && v[1] == 'x') {
    out.reserve((n - 2) / 2);
    for (size_t i = 2; i + 1 < n; i += 2) out.push_back(static_cast<char>(HexVal(v[i]) * 16 + HexVal(v[i + 1])));
    return out;
  }
  return std::string(v, n);
}

int64_t Rows::Affected() const {
  const char* s = PQcmdTuples(r_.get());
  return (s && *s) ? std::stoll(s) : 0;
}

Status StatusFromResult(const PGresult* r, PGconn* c) {
  auto trimmed = [](std::string m) {
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    return m;
  };
  if (c != nullptr && PQstatus(c) == CONNECTION_BAD) {
    return Unavailable("the database is unavailable; retry later", "database-unavailable")
        .WithLogDetail("database connection lost: " + trimmed(PQerrorMessage(c)));
  }
  const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  const std::string code = state ? state : "";
  // Everything PostgreSQL said (message, DETAIL, HINT, CONTEXT, the statement of another
  // backend in a deadlock report) goes to the log detail only; the client-facing message is ours.
  std::string log = "[" + code + "] " + trimmed(r ? PQresultErrorMessage(r) : (c ? PQerrorMessage(c) : "unknown error"));
  if (const char* k = r ? PQresultErrorField(r, PG_DIAG_CONSTRAINT_NAME) : nullptr) log += std::string(" (constraint ") + k + ")";
  auto is = [&](const char* prefix) { return code.rfind(prefix, 0) == 0; };
  Status s;
  if (code == "23505") {
    s = FailedPrecondition("the request conflicts with existing data", "conflict");
  } else if (is("23")) {
    s = FailedPrecondition("the request violates a data constraint", "constraint");
  } else if (is("40")) {  // 40001 serialization failure, 40P01 deadlock, and the rest of the class
    s = Status(Code::kAborted, "the transaction conflicted with a concurrent one and was rolled back; retry",
               "transaction-conflict");
  } else if (code == "42501") {
    // The application role hitting a privilege or RLS wall is a server bug, never the caller's
    // fault: internal, with its own type.
    s = Internal("internal error: the database refused a privilege", "database-permission-denied");
  } else if (code == "OMKEY") {
    // oml.require_live_api_key: its primary message is ours ("API key ak_... is revoked").
    const char* primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    s = Unauthenticated(primary ? primary : "API key is revoked", "unauthenticated");
  } else if (code == "57014") {
    s = Unavailable("the database canceled the statement (a timeout or a cancel request); retry", "query-canceled");
  } else if (is("53") || code == "55P03") {  // insufficient resources; lock not available
    s = Unavailable("the database is busy; retry later", "database-busy");
  } else if (is("08") || is("57P") || code == "25006") {  // connection, shutdown, read-only standby
    s = Unavailable("the database is unavailable; retry later", "database-unavailable");
  } else if (code == "22012") {
    // Division by zero is how oml's guarded UPDATEs say "no row matched" (SELECT 1/count(*) FROM
    // the UPDATE's RETURNING); callers that use one turn this type into their own answer.
    s = Internal("a guarded statement matched no row", kZeroRowsGuard);
  } else {
    s = Internal("unexpected database error (SQLSTATE " + (code.empty() ? std::string("none") : code) + ")");
  }
  return std::move(s).WithLogDetail(std::move(log));
}

bool IsViolationOf(const Status& s, const std::string& constraint) {
  if (s.code() != Code::kFailedPrecondition || (s.type() != "conflict" && s.type() != "constraint")) return false;
  const std::string suffix = " (constraint " + constraint + ")";
  const std::string& d = s.log_detail();
  return d.size() >= suffix.size() && d.compare(d.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool CommitNoticeRefusesAck(const char* severity_nonlocalized, const char* sqlstate) {
  (void)sqlstate;  // 01000 and 57P01 are the expected ones; every WARNING counts (conn.h)
  if (severity_nonlocalized == nullptr) return true;
  return std::strcmp(severity_nonlocalized, "WARNING") == 0;
}

void Conn::OnNotice(void* arg, const PGresult* r) {
  auto* n = static_cast<Notices*>(arg);
  if (!n->in_commit) return;
  const char* severity = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
  if (CommitNoticeRefusesAck(severity, PQresultErrorField(r, PG_DIAG_SQLSTATE))) n->sync_rep_canceled = true;
}

Result<Conn> Conn::Connect(const std::string& url) {
  // A bounded connect (10 s) unless the URL sets its own connect_timeout: `url` is expanded in
  // place of dbname, after the default, so its own settings win.
  const char* keys[] = {"connect_timeout", "dbname", nullptr};
  const char* values[] = {"10", url.c_str(), nullptr};
  PGconn* c = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  Conn conn(c);
  PQsetNoticeReceiver(c, &Conn::OnNotice, conn.notices_.get());
  if (PQstatus(c) != CONNECTION_OK) {
    std::string m = PQerrorMessage(c);
    while (!m.empty() && m.back() == '\n') m.pop_back();
    // The host, port and role libpq names stay in the log detail.
    return Unavailable("cannot connect to PostgreSQL", "database-unavailable").WithLogDetail(m);
  }
  // English server messages (conn.h). A SET rather than `options=-c lc_messages=C` in the
  // startup packet: a role not allowed to set it would fail to connect at all, before
  // `oml serve` could say "run oml migrate".
  PGresult* r = PQexec(c, "SET lc_messages = 'C'");
  if (PQresultStatus(r) != PGRES_COMMAND_OK) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
      log::Warn("cannot set lc_messages = 'C' on this connection: server messages follow the server's language "
                "(run `oml migrate` as a superuser to grant it to oml_app)",
                {{"sqlstate", state ? state : ""}});
    }
  }
  PQclear(r);
  return conn;
}

bool Conn::healthy() const { return c_ && PQstatus(c_.get()) == CONNECTION_OK; }

void SetCommitWaitBound(std::chrono::milliseconds bound) { g_commit_wait_bound_ms = std::max<int64_t>(0, bound.count()); }

std::chrono::milliseconds CommitWaitBound() { return std::chrono::milliseconds(g_commit_wait_bound_ms.load()); }

Result<Rows> Conn::Exec(const std::string& sql) {
  const bool commit = IsCommit(sql);
  if (commit) notices_->sync_rep_canceled = false;
  notices_->in_commit = commit;
  const std::chrono::milliseconds bound = commit ? CommitWaitBound() : std::chrono::milliseconds(0);
  const uint64_t watch = bound.count() > 0 ? CommitWatchdog::Get().Arm(c_.get(), bound) : 0;
  PGresult* r = PQexec(c_.get(), sql.c_str());
  notices_->in_commit = false;
  if (watch && CommitWatchdog::Get().Disarm(watch) == CommitWatchdog::kCut) {
    PQclear(r);
    c_.reset();
    return NotReplicatedCut();
  }
  if (!ResultOk(r)) {
    Status s = StatusFromResult(r, c_.get());
    PQclear(r);
    return s;
  }
  return Rows(r);
}

Result<Rows> Conn::Query(const std::string& sql, const std::vector<Param>& params) {
  ParamArrays pa(params);
  const bool commit = IsCommit(sql);
  if (commit) notices_->sync_rep_canceled = false;
  notices_->in_commit = commit;
  const std::chrono::milliseconds bound = commit ? CommitWaitBound() : std::chrono::milliseconds(0);
  const uint64_t watch = bound.count() > 0 ? CommitWatchdog::Get().Arm(c_.get(), bound) : 0;
  PGresult* r = PQexecParams(c_.get(), sql.c_str(), static_cast<int>(params.size()), nullptr, pa.values.data(),
                             pa.lengths.data(), pa.formats.data(), 0);
  notices_->in_commit = false;
  if (watch && CommitWatchdog::Get().Disarm(watch) == CommitWatchdog::kCut) {
    PQclear(r);
    c_.reset();
    return NotReplicatedCut();
  }
  if (!ResultOk(r)) {
    Status s = StatusFromResult(r, c_.get());
    PQclear(r);
    return s;
  }
  return Rows(r);
}

Result<std::vector<Rows>> Conn::Pipeline(const std::vector<Stmt>& stmts) {
  PGconn* c = c_.get();
  if (PQenterPipelineMode(c) != 1) return StatusFromResult(nullptr, c);
  Status send_err;
  // One entry per query sent, in order: the statement name if it is a Prepare, "" otherwise;
  // and whether it is a COMMIT.
  std::vector<std::string> sent;
  std::vector<bool> sent_commit;
  std::unordered_set<std::string> preparing;
  for (const auto& s : stmts) {
    ParamArrays pa(s.params);
    const int n = static_cast<int>(s.params.size());
    int ok;
    if (s.name.empty()) {
      ok = PQsendQueryParams(c, s.sql.c_str(), n, nullptr, pa.values.data(), pa.lengths.data(), pa.formats.data(),
                             s.binary_result ? 1 : 0);
      sent.emplace_back();
      sent_commit.push_back(IsCommit(s.sql));
    } else {
      if (!prepared_.count(s.name) && !preparing.count(s.name)) {
        if (PQsendPrepare(c, s.name.c_str(), s.sql.c_str(), n, nullptr) != 1) {
          send_err = StatusFromResult(nullptr, c);
          break;
        }
        sent.push_back(s.name);
        sent_commit.push_back(false);
        preparing.insert(s.name);
      }
      ok = PQsendQueryPrepared(c, s.name.c_str(), n, pa.values.data(), pa.lengths.data(), pa.formats.data(),
                               s.binary_result ? 1 : 0);
      sent.emplace_back();
      sent_commit.push_back(IsCommit(s.sql));
    }
    if (ok != 1) {
      send_err = StatusFromResult(nullptr, c);
      break;
    }
  }
  const bool synced = PQpipelineSync(c) == 1;
  if (!synced && send_err.ok()) send_err = StatusFromResult(nullptr, c);
  std::vector<Rows> out;
  Status first_err = send_err;
  // Drain: each query yields its result(s) then NULL; aborted ones PGRES_PIPELINE_ABORTED;
  // finally PGRES_PIPELINE_SYNC. Prepare results are consumed here, not returned.
  size_t idx = 0;
  size_t armed = sent.size();  // the COMMIT whose notices are being watched
  const std::chrono::milliseconds bound = CommitWaitBound();
  // The bound counts from here, for the whole pipeline: PostgreSQL sends no result of a pipeline
  // before its Sync (or a full output buffer), so the statements before a COMMIT answer only
  // once it has. A cancel that lands before the COMMIT fails that statement (57014, nothing
  // committed); callers send their slow statements (the chain lock) in a pipeline of their own.
  uint64_t watch = 0;  // the CommitWatchdog entry of this pipeline's COMMIT
  if (bound.count() > 0 && std::find(sent_commit.begin(), sent_commit.end(), true) != sent_commit.end())
    watch = CommitWatchdog::Get().Arm(c, bound);
  auto disarm = [&] {
    if (watch && CommitWatchdog::Get().Disarm(watch) == CommitWatchdog::kCut && first_err.ok())
      first_err = NotReplicatedCut();
    watch = 0;
  };
  for (;;) {
    // A query's notices arrive between its first result message and its CommandComplete, so
    // they are processed while PQgetResult reads that query's results (libpq parses a NOTICE
    // at once, but only after the messages before it).
    const bool commit = idx < sent_commit.size() && sent_commit[idx];
    if (commit && armed != idx) {
      notices_->sync_rep_canceled = false;
      armed = idx;
    }
    notices_->in_commit = commit;
    PGresult* r = PQgetResult(c);
    if (r == nullptr) {
      if (!synced || PQstatus(c) == CONNECTION_BAD) {  // no sync result will ever come
        if (first_err.ok()) first_err = StatusFromResult(nullptr, c);
        break;
      }
      ++idx;  // end of one query's results
      continue;
    }
    auto st = PQresultStatus(r);
    if (st == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      break;
    }
    const bool is_prepare = idx < sent.size() && !sent[idx].empty();
    if (st == PGRES_PIPELINE_ABORTED) {
      PQclear(r);
      continue;
    }
    if (!ResultOk(r)) {
      if (first_err.ok()) first_err = StatusFromResult(r, c);
      PQclear(r);
      continue;
    }
    if (is_prepare) {
      prepared_.insert(sent[idx]);
      PQclear(r);
      continue;
    }
    out.emplace_back(r);
  }
  notices_->in_commit = false;
  disarm();
  if (PQexitPipelineMode(c) != 1) {
    // Unusable for the next user: close it so the pool drops it.
    c_.reset();
    if (first_err.ok()) first_err = Unavailable("pipeline left the connection unusable", "database-unavailable");
  }
  if (!first_err.ok()) return first_err;
  return out;
}

Result<Rows> Conn::Scoped(const std::string& tenant, Stmt stmt) {
  OML_ASSIGN_OR_RETURN(std::vector<Rows> rs,
                       Pipeline({{"BEGIN", {}},
                                 ScopeTo(tenant),
                                 std::move(stmt),
                                 {"COMMIT", {}}}));
  return std::move(rs[2]);
}

Status Conn::CommitVerdict(const Rows& commit) {
  if (commit.CommandTag() != "COMMIT") return Status(Code::kAborted, "COMMIT answered " + commit.CommandTag());
  if (TakeSyncRepWarning())
    return Unavailable("the commit was not confirmed by the synchronous standbys; its outcome must be "
                       "checked before retrying",
                       "commit-not-replicated");
  return Status::Ok();
}

bool Conn::Alive() {
  if (!healthy()) return false;
  pollfd p{PQsocket(c_.get()), POLLIN, 0};
  if (p.fd < 0) return false;
  if (::poll(&p, 1, 0) > 0) {
    // An idle connection receives nothing but notices, notifications or the server's goodbye
    // (an ErrorResponse, then end of stream). Consume what arrived, then look for the end.
    if (PQconsumeInput(c_.get()) != 1) return false;
    if (PQisBusy(c_.get()) != 0) return false;
    char byte;
    const ssize_t n = ::recv(p.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return false;                                           // the server hung up
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;  // reset
  }
  return healthy();
}

namespace {
// The calling thread's share (Pool::ScopedShare): name and cap override (0: the pool default).
thread_local std::string tls_share;
thread_local int tls_share_cap = 0;
thread_local std::chrono::milliseconds tls_share_wait{0};
}  // namespace

Pool::Pool(std::string url, Options o) : url_(std::move(url)), opts_(o) {}

Pool::ScopedShare::ScopedShare(std::string share, int cap, std::chrono::milliseconds max_wait)
    : prev_share_(std::move(tls_share)), prev_cap_(tls_share_cap), prev_wait_(tls_share_wait) {
  tls_share = std::move(share);
  tls_share_cap = cap;
  tls_share_wait = max_wait;
}

Pool::ScopedShare::~ScopedShare() {
  tls_share = std::move(prev_share_);
  tls_share_cap = prev_cap_;
  tls_share_wait = prev_wait_;
}

Pool::Handle::~Handle() {
  if (pool_ && conn_) pool_->Release(std::move(conn_), share_);
}

int Pool::InUse(const std::string& share) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = share_in_use_.find(share);
  return it == share_in_use_.end() ? 0 : it->second;
}

Result<Pool::Handle> Pool::Acquire() {
  const std::string share = tls_share;
  const int cap = share.empty() ? opts_.size
                  : tls_share_cap > 0 ? tls_share_cap
                  : opts_.default_share_cap > 0 ? opts_.default_share_cap
                                                : std::max(1, opts_.size - std::max(1, opts_.size / 4));
  std::chrono::milliseconds wait = opts_.acquire_timeout;
  if (tls_share_wait.count() > 0 && (wait.count() == 0 || tls_share_wait < wait)) wait = tls_share_wait;
  const bool bounded = wait.count() > 0;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    const bool share_full = !share.empty() && share_in_use_[share] >= cap;
    if (!share_full && !idle_.empty()) {
      auto c = std::move(idle_.front());
      idle_.pop_front();
      if (!c->Alive()) {
        --open_;
        continue;
      }
      if (!share.empty()) ++share_in_use_[share];
      return Handle(this, std::move(c), share);
    }
    if (!share_full && open_ < opts_.size) {
      ++open_;
      if (!share.empty()) ++share_in_use_[share];
      l.unlock();
      auto c = Conn::Connect(url_);
      if (!c.ok()) {
        std::lock_guard<std::mutex> g(mu_);
        --open_;
        if (!share.empty() && --share_in_use_[share] == 0) share_in_use_.erase(share);
        cv_.notify_all();
        return c.status();
      }
      return Handle(this, std::make_unique<Conn>(std::move(c).value()), share);
    }
    if (share_in_use_[share] == 0) share_in_use_.erase(share);
    if (!bounded) {
      cv_.wait(l);
    } else if (cv_.wait_until(l, deadline) == std::cv_status::timeout && std::chrono::steady_clock::now() >= deadline) {
      return Unavailable("no database connection became free within " + std::to_string(wait.count()) +
                             " ms" + (share_full ? " (this client's share of the pool is in use)" : ""),
                         "database-busy");
    }
  }
}

void Pool::Release(std::unique_ptr<Conn> c, const std::string& share) {
  std::lock_guard<std::mutex> l(mu_);
  if (!share.empty()) {
    auto it = share_in_use_.find(share);
    if (it != share_in_use_.end() && --it->second <= 0) share_in_use_.erase(it);
  }
  if (c->healthy() && PQtransactionStatus(c->raw()) == PQTRANS_IDLE) {
    idle_.push_back(std::move(c));
  } else {
    --open_;  // drop a broken connection or one left inside a transaction
  }
  // Waiters of different shares wait on one condition: wake them all so that one whose share
  // is at its cap does not swallow the wakeup another could use.
  cv_.notify_all();
}

std::string QuoteIdent(Conn& c, const std::string& s) {
  char* q = PQescapeIdentifier(c.raw(), s.data(), s.size());
  std::string out(q ? q : "");
  PQfreemem(q);
  return out;
}

std::string QuoteLiteral(Conn& c, const std::string& s) {
  char* q = PQescapeLiteral(c.raw(), s.data(), s.size());
  std::string out(q ? q : "");
  PQfreemem(q);
  return out;
}

}  // namespace oml::db
