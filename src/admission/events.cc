#include "admission/events.h"

#include <algorithm>
#include <cstdint>

namespace oml::admission {
namespace {

// Candidate seqs of a page: $1 tenant, $2 after, $3 limit, $5 principal (writers only). Each
// candidate carries its size in bytes; octet_length of a bytea reads the stored length, without
// detoasting the value, so sizing a page costs no more than finding it.
const char* kWholeChain =
    "SELECT j.seq, octet_length(j.signed_bytes) + octet_length(j.signature) AS nb FROM oml.journal j "
    "WHERE j.tenant_id = $1 AND j.seq > $2 ORDER BY j.seq LIMIT $3";

// A writer's events (events.h), from the fold tables, each branch by an index of sql/0007 and
// cut to `limit` before the union, so the work is bounded by the page, not by the chain. The
// readable branch names every state but 'promoted' (claims.cc HiddenFrom): a list that contains
// the index predicate's ('held', 'erased'), so the planner proves it and uses the partial index.
const char* kWritersEvents =
    "SELECT j.seq, octet_length(j.signed_bytes) + octet_length(j.signature) AS nb "
    "FROM (SELECT v.seq FROM ("
    "  (SELECT a.submitted_seq AS seq FROM oml.artifacts a WHERE a.tenant_id = $1 AND a.principal = $5 "
    "     AND a.submitted_seq > $2 ORDER BY a.submitted_seq LIMIT $3) "
    "  UNION (SELECT a.erased_seq FROM oml.artifacts a WHERE a.tenant_id = $1 AND a.principal = $5 "
    "     AND a.erased_seq > $2 ORDER BY a.erased_seq LIMIT $3) "
    "  UNION (SELECT a.submitted_seq FROM oml.artifacts a WHERE a.tenant_id = $1 "
    "     AND a.state NOT IN ('held', 'erased', 'rejected', 'demoted', 'retracted') AND a.submitted_seq > $2 "
    "     ORDER BY a.submitted_seq LIMIT $3) "
    "  UNION (SELECT k.created_seq FROM oml.api_keys k WHERE k.tenant_id = $1 AND k.principal = $5 "
    "     AND k.created_seq > $2 ORDER BY k.created_seq LIMIT $3) "
    "  UNION (SELECT k.revoked_seq FROM oml.api_keys k WHERE k.tenant_id = $1 AND k.principal = $5 "
    "     AND k.revoked_seq > $2 ORDER BY k.revoked_seq LIMIT $3)"
    ") v ORDER BY v.seq LIMIT $3) s "
    "JOIN oml.journal j ON j.tenant_id = $1 AND j.seq = s.seq ORDER BY j.seq";

// The page: candidates in seq order while their running byte total stays within $4, and always
// the first. n = the number of candidates (to tell a cut page from an exhausted one).
std::string PageSql(const char* candidates) {
  return std::string("WITH cand AS (") + candidates +
         "), w AS (SELECT seq, sum(nb) OVER (ORDER BY seq) AS run, row_number() OVER (ORDER BY seq) AS rn, "
         "count(*) OVER () AS n FROM cand) "
         "SELECT j.seq, j.prev_hash, j.event_hash, j.event_type, j.key_id, j.signed_bytes, j.signature, "
         "to_char(j.committed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), w.n "
         "FROM w JOIN oml.journal j ON j.tenant_id = $1 AND j.seq = w.seq "
         "WHERE w.run <= $4 OR w.rn = 1 ORDER BY j.seq";
}

}  // namespace

bool SeesWholeChain(const Caller& caller) { return caller.role == "admin" || caller.role == "reviewer"; }

Result<EventsPage> ListEvents(db::Pool& pool, const Caller& caller, int64_t after, int limit, size_t max_page_bytes) {
  if (after < 0 || limit < 1 || max_page_bytes < 1)
    return InvalidArgument("events page needs after >= 0, limit >= 1 and a byte bound >= 1", "invalid-parameter");
  const bool whole = SeesWholeChain(caller);
  static const std::string kWholeSql = PageSql(kWholeChain);
  static const std::string kWriterSql = PageSql(kWritersEvents);
  std::vector<db::Param> params = {db::Text(caller.tenant_id), db::Int(after), db::Int(limit),
                                   db::Int(static_cast<int64_t>(std::min<uint64_t>(max_page_bytes, INT64_MAX)))};
  if (!whole) params.push_back(db::Text(caller.principal));
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool.Acquire());
  // One snapshot for the head and the page: every event up to the head is in it, fold rows
  // included (they commit in the event's transaction).
  auto rs = conn->Pipeline(
      {{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", {}},
       db::ScopeTo(caller.tenant_id),
       {"SELECT coalesce((SELECT seq FROM oml.chain_heads WHERE tenant_id = $1), 0)", {db::Text(caller.tenant_id)},
        "oml_events_head"},
       {whole ? kWholeSql : kWriterSql, std::move(params), whole ? "oml_events_whole" : "oml_events_writer", true},
       {"COMMIT", {}}});
  if (!rs.ok()) {
    (void)conn->Exec("ROLLBACK");
    return rs.status();
  }
  const int64_t head = (*rs)[2].GetInt(0, 0);
  const db::Rows& r = (*rs)[3];
  EventsPage page;
  page.events.reserve(r.size());
  for (int i = 0; i < r.size(); ++i) {
    EventRow e;
    e.seq = r.GetInt(i, 0);
    e.prev_hash = r.GetBytes(i, 1);
    e.event_hash = r.GetBytes(i, 2);
    e.type = r.Get(i, 3);
    e.key_id = r.Get(i, 4);
    e.signed_bytes = r.GetBytes(i, 5);
    e.signature = r.GetBytes(i, 6);
    e.committed_at = r.Get(i, 7);
    page.events.push_back(std::move(e));
  }
  const int64_t candidates = r.size() > 0 ? r.GetInt(0, 8) : 0;
  const bool cut = candidates >= limit || static_cast<int64_t>(page.events.size()) < candidates;
  page.next_after = cut ? page.events.back().seq : std::max(after, head);
  return page;
}

}  // namespace oml::admission
