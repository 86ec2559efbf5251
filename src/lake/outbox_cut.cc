#include "lake/outbox_cut.h"

#include <libpq-fe.h>

#include <regex>
#include <thread>

namespace oml::lake {
namespace {

uint64_t ParseXid(const std::string& s) { return std::stoull(s); }

Status RequireIdle(db::Conn& c, const char* what) {
  if (PQtransactionStatus(c.raw()) != PQTRANS_IDLE) {
    return FailedPrecondition(std::string(what) + " needs a connection outside any transaction", "transaction-open");
  }
  return Status::Ok();
}

OutboxRow RowAt(const db::Rows& r, int i) {
  OutboxRow o;
  o.seq = r.GetInt(i, 0);
  o.tenant_id = r.Get(i, 1);
  o.xid = ParseXid(r.Get(i, 2));
  o.target_table = r.Get(i, 3);
  o.journal_seq = r.GetInt(i, 4);
  o.row_data = r.Get(i, 5);
  o.enqueued_at = r.Get(i, 6);
  o.skip_tables = SplitTableList(r.Get(i, 7));
  return o;
}

// `table` comes from the stream registry, never from input.
std::string SelectRows(const OutboxStream& s) {
  return "SELECT seq, tenant_id::text, xid::text, target_table, journal_seq, row_data::text, enqueued_at::text, "
         "coalesce(array_to_string(skip_tables, ','), '') FROM " +
         s.table + " WHERE seq > $1 AND seq <= $2 ORDER BY seq";
}

}  // namespace

std::vector<std::string> SplitTableList(const std::string& list) {
  std::vector<std::string> out;
  for (size_t at = 0; !list.empty();) {
    const size_t comma = list.find(',', at);
    out.push_back(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

Result<OutboxStream> ResolveStream(std::string_view name) {
  static const std::regex kName("[a-z0-9][a-z0-9_-]{0,62}");
  if (!std::regex_match(name.begin(), name.end(), kName)) {
    return InvalidArgument("outbox stream name must match [a-z0-9][a-z0-9_-]{0,62}", "invalid-field");
  }
  if (name == kDefaultStream) return OutboxStream{kDefaultStream, "oml.outbox", "oml.outbox_seq"};
  return NotFound("no outbox stream named " + std::string(name), "unknown-stream");
}

std::string AppIdFor(std::string_view stream) {
  if (stream == kDefaultStream) return "oml-lakewriter";
  return "oml-lakewriter-" + std::string(stream);
}

Result<int64_t> LastSeq(db::Conn& c, const OutboxStream& s) {
  OML_ASSIGN_OR_RETURN(db::Rows l, c.Query("SELECT coalesce(pg_sequence_last_value($1::regclass), 0)", {db::Text(s.sequence)}));
  return l.GetInt(0, 0);
}

namespace {

// X: an xid taken in its own autocommit transaction, after L was read.
Result<HorizonProbe> FenceAfter(db::Conn& c, int64_t candidate) {
  HorizonProbe p;
  p.candidate = candidate;
  OML_ASSIGN_OR_RETURN(db::Rows x, c.Query("SELECT pg_current_xact_id()::text"));
  p.fence_xid = ParseXid(x.Get(0, 0));
  return p;
}

}  // namespace

Result<HorizonProbe> ProbeHorizon(db::Conn& c, const OutboxStream& s) {
  OML_RETURN_IF_ERROR(RequireIdle(c, "the horizon probe"));
  // Order matters: L first (round trip 1), X after it (round trip 2). Both are their own
  // autocommit transactions, so X's has ended when its result arrives.
  OML_ASSIGN_OR_RETURN(int64_t l, LastSeq(c, s));
  return FenceAfter(c, l);
}

Result<HorizonProbe> ProbeHorizonWithoutXid(db::Conn& c, const OutboxStream& s) {
  OML_RETURN_IF_ERROR(RequireIdle(c, "the horizon probe"));
  OML_ASSIGN_OR_RETURN(int64_t l, LastSeq(c, s));
  // Round trip 2 (after L): every xid assigned before this statement either ended or still holds
  // the ExclusiveLock on itself (pg_locks, which every role reads whole). The snapshot's xip lists
  // those below its xmax; those at or above xmax (assigned after the newest completed xid) are
  // mapped from pg_locks' 32-bit xid to xid8 by their distance above xmax (below 2^31: they are
  // younger than xmax). X is xmax, or one past the newest of those.
  static const char* kSql =
      "WITH s AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::numeric AS xmax8), "
      "ahead AS (SELECT (l.transactionid::text::numeric - (s.xmax8 % 4294967296) + 4294967296) % 4294967296 AS d "
      "            FROM pg_locks l, s WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' "
      "             AND l.granted) "
      "SELECT (s.xmax8 + coalesce((SELECT max(d) + 1 FROM ahead WHERE d < 2147483648), 0))::text FROM s";
  OML_ASSIGN_OR_RETURN(db::Rows x, c.Query(kSql));
  HorizonProbe p;
  p.candidate = l;
  p.fence_xid = ParseXid(x.Get(0, 0));
  return p;
}

Result<bool> IsStable(db::Conn& c, const HorizonProbe& probe) {
  OML_ASSIGN_OR_RETURN(db::Rows r, c.Query("SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::xid8",
                                           {db::Text(std::to_string(probe.fence_xid))}));
  return r.Get(0, 0) == "t";
}

Result<int64_t> StableHorizon(db::Conn& c, const OutboxStream& s, int64_t previous, std::chrono::milliseconds max_wait,
                              std::chrono::milliseconds poll_every) {
  OML_ASSIGN_OR_RETURN(HorizonProbe p, ProbeHorizon(c, s));
  const auto deadline = std::chrono::steady_clock::now() + max_wait;
  for (;;) {
    OML_ASSIGN_OR_RETURN(bool stable, IsStable(c, p));
    if (stable) return std::max(previous, p.candidate);
    if (std::chrono::steady_clock::now() >= deadline) return previous;
    std::this_thread::sleep_for(poll_every);
  }
}

Result<int64_t> HorizonTracker::Poll(db::Conn& c) {
  if (!pending_) {
    OML_RETURN_IF_ERROR(RequireIdle(c, "the horizon probe"));
    OML_ASSIGN_OR_RETURN(int64_t l, LastSeq(c, stream_));
    if (l <= stable_) return stable_;  // nothing drawn since: no probe, so no xid spent
    OML_ASSIGN_OR_RETURN(HorizonProbe p, FenceAfter(c, l));
    pending_ = p;
    pending_since_ = std::chrono::steady_clock::now();
  }
  OML_ASSIGN_OR_RETURN(bool stable, IsStable(c, *pending_));
  if (stable) {
    stable_ = std::max(stable_, pending_->candidate);
    pending_.reset();
  }
  return stable_;
}

Result<std::vector<OutboxRow>> ReadRange(db::Conn& c, const OutboxStream& s, int64_t from_exclusive, int64_t to_inclusive) {
  if (from_exclusive < 0 || from_exclusive > to_inclusive) {
    return InvalidArgument("outbox range (" + std::to_string(from_exclusive) + ", " + std::to_string(to_inclusive) +
                           "] is not a range");
  }
  OML_ASSIGN_OR_RETURN(db::Rows r, c.Query(SelectRows(s), {db::Int(from_exclusive), db::Int(to_inclusive)}));
  std::vector<OutboxRow> out;
  out.reserve(r.size());
  for (int i = 0; i < r.size(); ++i) out.push_back(RowAt(r, i));
  return out;
}

Result<Cut> CutBatch(db::Conn& c, const OutboxStream& s, int64_t frontier, int64_t stable_horizon, int64_t max_rows) {
  if (max_rows < 1) return InvalidArgument("a batch holds at least one row");
  if (frontier < 0) return InvalidArgument("the frontier is never negative");
  Cut cut;
  cut.frontier = frontier;
  cut.batch_end = frontier;
  if (stable_horizon <= frontier) return cut;
  OML_ASSIGN_OR_RETURN(db::Rows r, c.Query(SelectRows(s) + " LIMIT $3",
                                           {db::Int(frontier), db::Int(stable_horizon), db::Int(max_rows)}));
  cut.rows.reserve(r.size());
  for (int i = 0; i < r.size(); ++i) cut.rows.push_back(RowAt(r, i));
  // A full batch ends at its last row (rows above it, up to the horizon, go to the next batch);
  // a short one takes the whole stable prefix, gaps included.
  cut.batch_end = static_cast<int64_t>(cut.rows.size()) == max_rows ? cut.rows.back().seq : stable_horizon;
  return cut;
}

Result<int64_t> ReadFrontier(db::Conn& c, const OutboxStream& s) {
  OML_ASSIGN_OR_RETURN(db::Rows r, c.Query("SELECT frontier_seq FROM oml.lake_frontier WHERE stream = $1", {db::Text(s.name)}));
  if (r.size() == 0) return NotFound("outbox stream " + s.name + " has no frontier row", "unknown-stream");
  return r.GetInt(0, 0);
}

Result<std::vector<HorizonHolder>> HorizonHolders(db::Conn& c, const HorizonProbe& probe) {
  // Every running xid holds the ExclusiveLock on itself (pg_locks, read whole by every role),
  // also one at or above the snapshot's xmax, which xip would not list (X of
  // ProbeHorizonWithoutXid can be above xmax). pg_locks, pg_stat_activity and pg_prepared_xacts
  // show 32-bit xids: each is mapped to the xid8 nearest the snapshot's xmax (a running xid is
  // less than 2^31 transactions from it), and matched on the low 32 bits.
  static const char* kSql =
      "WITH s AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::numeric AS xmax8), "
      "running AS (SELECT DISTINCT l.transactionid::text AS x32, "
      "       (l.transactionid::text::numeric - (s.xmax8 % 4294967296) + 4294967296) % 4294967296 AS d, s.xmax8 "
      "  FROM pg_locks l, s WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted), "
      "held AS ("
      "  SELECT (CASE WHEN d < 2147483648 THEN xmax8 + d ELSE xmax8 + d - 4294967296 END)::text::xid8 AS x, x32"
      "    FROM running WHERE (CASE WHEN d < 2147483648 THEN xmax8 + d ELSE xmax8 + d - 4294967296 END) "
      "                       < $1::text::numeric) "
      "SELECT h.x, age(a.backend_xid)::bigint, a.pid, ''::text, coalesce(a.usename::text, ''),"
      "       coalesce(a.application_name, ''), coalesce(a.state, ''),"
      "       extract(epoch FROM now() - a.xact_start)::float8, a.xact_start::text, a.query_start::text"
      "  FROM held h JOIN pg_stat_activity a ON a.backend_xid::text = h.x32 "
      "UNION ALL "
      "SELECT h.x, age(p.transaction)::bigint, NULL::int, p.gid, p.owner::text, '', 'prepared',"
      "       extract(epoch FROM now() - p.prepared)::float8, p.prepared::text, NULL::text"
      "  FROM held h JOIN pg_prepared_xacts p ON p.transaction::text = h.x32 "
      "ORDER BY 1";
  OML_ASSIGN_OR_RETURN(db::Rows r, c.Query(kSql, {db::Text(std::to_string(probe.fence_xid))}));
  std::vector<HorizonHolder> out;
  for (int i = 0; i < r.size(); ++i) {
    HorizonHolder h;
    h.xid = ParseXid(r.Get(i, 0));
    h.xid_age = r.GetInt(i, 1);
    if (!r.IsNull(i, 2)) h.pid = static_cast<int>(r.GetInt(i, 2));
    h.gid = r.Get(i, 3);
    h.role = r.Get(i, 4);
    h.application_name = r.Get(i, 5);
    h.state = r.Get(i, 6);
    if (!r.IsNull(i, 7)) h.xact_age_s = std::stod(r.Get(i, 7));
    if (!r.IsNull(i, 8)) h.xact_start = r.Get(i, 8);
    if (!r.IsNull(i, 9)) h.query_start = r.Get(i, 9);
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace oml::lake
