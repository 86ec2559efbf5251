#include "admission/recall.h"

#include <cmath>
#include <deque>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <regex>
#include <utility>

#include "admission/cursor.h"
#include "fields/fields.h"
#include "crypto/crypto.h"

namespace oml::admission {
namespace {

using nlohmann::json;

Status BadParam(const std::string& m) { return InvalidArgument(m, "invalid-parameter"); }

bool SeesEveryClaim(const Caller& c) { return c.role == "reviewer" || c.role == "admin"; }

// ---- RFC 3339 times ---------------------------------------------------------------------------

// "YYYY-MM-DDTHH:MM:SS[.f{1,6}](Z|+HH:MM|-HH:MM)", a real calendar date and time of day (no leap
// second), year 0001..9999; an offset within +-23:59 (' ' before the offset is read as '+', the
// form a URL's unescaped '+' takes). Returns the same instant in UTC, "YYYY-MM-DD HH:MM:SS[.f]"
// with "+00" (and " BC" for a year before 1: 0001-01-01T00:00:00+23:59), ready for PostgreSQL's
// timestamptz input, whose offsets stop at +-15:59; nullopt if it is not one.
std::optional<std::string> Rfc3339(std::string v) {
  static const std::regex kTime(
      R"(^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,6})?(Z|([-+ ])(\d{2}):(\d{2}))$)");
  std::smatch m;
  if (!std::regex_match(v, m, kTime)) return std::nullopt;
  auto num = [&](int i) { return std::stoi(m[i].str()); };
  const int y = num(1), mo = num(2), d = num(3), h = num(4), mi = num(5), s = num(6);
  if (y < 1 || h > 23 || mi > 59 || s > 59) return std::nullopt;
  namespace ch = std::chrono;
  const ch::year_month_day date{ch::year{y}, ch::month{static_cast<unsigned>(mo)}, ch::day{static_cast<unsigned>(d)}};
  if (!date.ok()) return std::nullopt;
  int offset_min = 0;
  if (m[8].str() != "Z") {
    if (num(10) > 23 || num(11) > 59) return std::nullopt;
    offset_min = (num(10) * 60 + num(11)) * (m[9].str() == "-" ? -1 : 1);
  }
  const ch::sys_seconds utc =
      ch::sys_days{date} + ch::hours{h} + ch::minutes{mi - offset_min} + ch::seconds{s};
  const ch::sys_days day = ch::floor<ch::days>(utc);
  const ch::year_month_day u{day};
  const ch::hh_mm_ss<ch::seconds> t{utc - day};
  const int uy = static_cast<int>(u.year());
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02u %02d:%02d:%02d%s+00%s", uy >= 1 ? uy : 1 - uy,
                static_cast<unsigned>(u.month()), static_cast<unsigned>(u.day()), static_cast<int>(t.hours().count()),
                static_cast<int>(t.minutes().count()), static_cast<int>(t.seconds().count()), m[7].str().c_str(),
                uy >= 1 ? "" : " BC");
  return std::string(buf);
}

// ---- Cursors (admission/cursor.h) -------------------------------------------------------------

// What a cursor is bound to: 16 hex of SHA-256 over the tenant, the endpoint and its arguments.
std::string Binding(const Caller& c, const json& query) {
  return crypto::Hex(crypto::Sha256(json::array({c.tenant_id, query}).dump())).substr(0, 16);
}

using Position = CursorPosition;

// ---- Rows ---------------------------------------------------------------------------------------

// The columns of a listed claim, in RowToClaim's order; every query aliases artifacts as `a`.
const char* kColumns =
    "a.artifact_id, a.version, a.workarea_id, a.path, a.principal, a.writer_key_id, a.provenance, a.simulation_id, "
    "a.media_type, a.size_bytes, a.plaintext_sha256, a.ciphertext_sha256, a.state, a.submitted_seq, a.erased_seq, "
    "a.promoted_seq, a.rejected_seq, a.demoted_seq, a.body_review::text, "
    "to_char(a.submitted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS submitted_at_text";
constexpr int kColumnCount = 20;

RecalledClaim RowToClaim(const db::Rows& r, int i) {
  RecalledClaim out;
  ClaimMeta& m = out.meta;
  m.artifact_id = r.Get(i, 0);
  m.version = static_cast<int>(r.GetInt(i, 1));
  m.workarea_id = r.Get(i, 2);
  m.path = r.Get(i, 3);
  m.principal = r.Get(i, 4);
  m.writer_key_id = r.Get(i, 5);
  m.provenance = r.Get(i, 6);
  if (!r.IsNull(i, 7)) m.simulation_id = r.Get(i, 7);
  m.media_type = r.Get(i, 8);
  m.size = r.GetInt(i, 9);
  m.plaintext_sha256 = r.GetBytes(i, 10);
  m.ciphertext_sha256 = r.GetBytes(i, 11);
  m.state = r.Get(i, 12);
  m.submitted_seq = r.GetInt(i, 13);
  if (!r.IsNull(i, 14)) m.erased_seq = r.GetInt(i, 14);
  if (!r.IsNull(i, 15)) m.promoted_seq = r.GetInt(i, 15);
  if (!r.IsNull(i, 16)) m.rejected_seq = r.GetInt(i, 16);
  if (!r.IsNull(i, 17)) m.demoted_seq = r.GetInt(i, 17);
  if (!r.IsNull(i, 18)) m.body_review = json::parse(r.Get(i, 18), nullptr, /*allow_exceptions=*/false);
  if (!r.IsNull(i, 19)) out.submitted_at = r.Get(i, 19);
  return out;
}

// The newest version of its artifact (as claims.cc Load reads one), by the primary key.
const char* kNewest =
    " AND NOT EXISTS (SELECT 1 FROM oml.artifacts n WHERE n.tenant_id = a.tenant_id AND n.artifact_id = a.artifact_id "
    "AND n.version > a.version)";

struct Query {
  std::string sql;
  std::vector<db::Param> params;
  std::string Add(db::Param p) {
    params.push_back(std::move(p));
    return "$" + std::to_string(params.size());
  }
};

// ---- The list query -----------------------------------------------------------------------------
//
// $1 tenant, $2 limit + 1. Each visibility branch (claims.cc HiddenFrom, recall.h's table) is one
// query ordered like the page and cut at $2, so it is one backward range scan of the index of its
// most selective condition (sql/0012); two branches are merged and cut again. A writer's branches
// are disjoint (promoted / its own not promoted), so no row comes twice.
json ListQueryJson(const ClaimFilter& f) {
  auto o = [](const std::optional<std::string>& v) { return v ? json(*v) : json(nullptr); };
  return json::array({"claims", o(f.workarea_id), o(f.state), o(f.provenance), o(f.simulation_id), o(f.submitted_after),
                      o(f.submitted_before)});
}

// The time filter as a seq range (sql/0012: times never decrease with seq): the claims signed
// after T are those above the last seq stamped at or before T, those before T below the first seq
// stamped at or after T. Each bound is one probe of artifacts_recall_time. Read first, in the
// page's snapshot, so that the page query gets the bounds as values the planner can estimate.
struct SeqRange {
  std::optional<int64_t> above, below;
};

// (above, below); a bound not asked for is 0 / INT64_MAX.
Query BoundsQuery(const Caller& c, const ClaimFilter& f) {
  Query q;
  q.Add(db::Text(c.tenant_id));
  std::string above = "0", below = "9223372036854775807";
  if (f.submitted_after)
    above = "coalesce((SELECT b.submitted_seq FROM oml.artifacts b WHERE b.tenant_id = $1 AND b.submitted_at <= " +
            q.Add(db::Text(*Rfc3339(*f.submitted_after))) +
            "::timestamptz ORDER BY b.submitted_at DESC, b.submitted_seq DESC LIMIT 1), 0)";
  if (f.submitted_before)
    below = "coalesce((SELECT b.submitted_seq FROM oml.artifacts b WHERE b.tenant_id = $1 AND b.submitted_at >= " +
            q.Add(db::Text(*Rfc3339(*f.submitted_before))) +
            "::timestamptz ORDER BY b.submitted_at, b.submitted_seq LIMIT 1), " + below + ")";
  q.sql = "SELECT " + above + ", " + below;
  return q;
}

Query BuildList(const Caller& c, const ClaimFilter& f, int limit, const std::optional<Position>& pos,
                const SeqRange& range) {
  Query q;
  q.Add(db::Text(c.tenant_id));
  q.Add(db::Int(limit + 1));
  std::string common = "a.tenant_id = $1";
  if (f.workarea_id) common += " AND a.workarea_id = " + q.Add(db::Text(*f.workarea_id));
  if (f.provenance) common += " AND a.provenance = " + q.Add(db::Text(*f.provenance));
  if (f.simulation_id) common += " AND a.simulation_id = " + q.Add(db::Text(*f.simulation_id));
  if (range.above) common += " AND a.submitted_seq > " + q.Add(db::Int(*range.above));
  if (range.below) common += " AND a.submitted_seq < " + q.Add(db::Int(*range.below));
  if (pos)
    common += " AND (a.submitted_seq, a.artifact_id) < (" + q.Add(db::Int(pos->seq)) + ", " +
              q.Add(db::Text(pos->artifact_id)) + "::uuid)";
  common += kNewest;

  std::vector<std::string> branches;
  if (SeesEveryClaim(c)) {
    branches.push_back(f.state ? "a.state = " + q.Add(db::Text(*f.state)) : "a.state <> 'erased'");
  } else {
    const bool promoted = !f.state || *f.state == "promoted";
    if (promoted) branches.push_back("a.state = 'promoted'");
    if (!f.state)
      branches.push_back("a.principal = " + q.Add(db::Text(c.principal)) + " AND a.state IN ('held', 'rejected', 'demoted', 'retracted')");
    else if (!promoted)
      branches.push_back("a.principal = " + q.Add(db::Text(c.principal)) + " AND a.state = " + q.Add(db::Text(*f.state)));
  }
  const std::string order = " ORDER BY submitted_seq DESC, artifact_id DESC LIMIT $2";
  auto branch = [&](const std::string& b) {
    return std::string("SELECT ") + kColumns + " FROM oml.artifacts a WHERE " + common + " AND " + b +
           " ORDER BY a.submitted_seq DESC, a.artifact_id DESC LIMIT $2";
  };
  if (branches.size() == 1) {
    q.sql = branch(branches[0]);
  } else {
    q.sql = "SELECT * FROM ((" + branch(branches[0]) + ") UNION ALL (" + branch(branches[1]) + ")) u" + order;
  }
  return q;
}

// ---- The search query ---------------------------------------------------------------------------
//
// $1 tenant, $2 query text, $3 limit + 1. search_claim_text (sql/0012, a definer function: under
// RLS the GIN index could not be used) finds the matching chunks through claim_text_tsv; a
// claim's rank is its best chunk's. Only promoted newest versions are answered (claim_text holds
// nothing else; the join says so again).
json SearchQueryJson(const std::string& text) { return json::array({"search", text}); }

Query BuildSearch(const Caller& c, const std::string& text, int limit, const std::optional<Position>& pos) {
  Query q;
  q.Add(db::Text(c.tenant_id));
  q.Add(db::Text(text));
  q.Add(db::Int(limit + 1));
  std::string keyset;
  if (pos)
    keyset = " AND (h.rank, a.submitted_seq, a.artifact_id) < (" + q.Add(db::Text(pos->rank)) + "::float8, " +
             q.Add(db::Int(pos->seq)) + ", " + q.Add(db::Text(pos->artifact_id)) + "::uuid)";
  q.sql = std::string("SELECT ") + kColumns +
          ", h.rank FROM oml.search_claim_text($2) h "
          "JOIN oml.artifacts a ON a.tenant_id = $1 AND a.artifact_id = h.artifact_id AND a.version = h.version "
          "WHERE a.state = 'promoted'" + std::string(kNewest) + keyset +
          " ORDER BY h.rank DESC, a.submitted_seq DESC, a.artifact_id DESC LIMIT $3";
  return q;
}

// Runs fn(conn) in one REPEATABLE READ READ ONLY snapshot scoped to the caller's tenant.
template <typename Fn>
auto InSnapshot(db::Pool& pool, const Caller& c, Fn&& fn) -> decltype(fn(std::declval<db::Conn&>())) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool.Acquire());
  auto begun = conn->Pipeline({{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", {}},
                               db::ScopeTo(c.tenant_id),
                               // float8 printed shortest-exact: a rank read back from a cursor is the same double.
                               {"SET LOCAL extra_float_digits = 1", {}}});
  if (!begun.ok()) {
    (void)conn->Exec("ROLLBACK");
    return begun.status();
  }
  auto out = fn(*conn);
  (void)conn->Exec(out.ok() ? "COMMIT" : "ROLLBACK");
  return out;
}

Result<db::Rows> Run(db::Conn& conn, const Query& q, bool explain) {
  return conn.Query(explain ? "EXPLAIN (COSTS OFF) " + q.sql : q.sql, q.params);
}

std::string PlanText(const db::Rows& r) {
  std::string plan;
  for (int i = 0; i < r.size(); ++i) plan += r.Get(i, 0) + "\n";
  return plan;
}

// The list page's rows (or, with `plan`, the plans of the bounds query and of the page query).
Result<db::Rows> ListPage(db::Conn& conn, const Caller& c, const ClaimFilter& f, int limit,
                          const std::optional<Position>& pos, std::string* plan) {
  SeqRange range;
  if (f.submitted_after || f.submitted_before) {
    const Query bq = BoundsQuery(c, f);
    OML_ASSIGN_OR_RETURN(db::Rows b, Run(conn, bq, false));
    if (f.submitted_after) range.above = b.GetInt(0, 0);
    if (f.submitted_before) range.below = b.GetInt(0, 1);
    if (plan) {
      OML_ASSIGN_OR_RETURN(db::Rows bp, Run(conn, bq, true));
      *plan += PlanText(bp);
    }
  }
  return Run(conn, BuildList(c, f, limit, pos, range), plan != nullptr);
}

Status CheckLimit(int limit) {
  if (limit < 1 || limit > kRecallMaxLimit)
    return BadParam("query parameter 'limit' must be an integer in [1, " + std::to_string(kRecallMaxLimit) + "]");
  return Status::Ok();
}

Status CheckQueryText(const std::string& text) {
  if (text.empty() || text.size() > kMaxSearchQueryBytes)
    return BadParam("query parameter 'q' must hold 1.." + std::to_string(kMaxSearchQueryBytes) + " bytes");
  // CheckReason's rules (UTF-8, no control character; its 1024 characters exceed our bytes).
  static_assert(kMaxSearchQueryBytes <= fields::kMaxReason);
  if (!fields::CheckReason(text).ok())
    return BadParam("query parameter 'q' must be UTF-8 without control characters");
  return Status::Ok();
}

// Keeps the valid UTF-8 of `text` (at most kMaxSearchTextBytes, cut at a character boundary);
// NUL bytes and bytes of invalid sequences become spaces.
std::string FitText(std::string_view text) {
  std::string out;
  out.reserve(std::min(text.size(), kMaxSearchTextBytes));
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len > 0 && i + len <= text.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) >> 6) == 2;
    if (ok && len >= 2) {  // no overlongs, surrogates or code points above U+10FFFF (RFC 3629)
      const unsigned char c1 = text[i + 1];
      if ((len == 2 && c < 0xC2) || (len == 3 && c == 0xE0 && c1 < 0xA0) || (len == 3 && c == 0xED && c1 >= 0xA0) ||
          (len == 4 && c == 0xF0 && c1 < 0x90) || (len == 4 && (c > 0xF4 || (c == 0xF4 && c1 >= 0x90))))
        ok = false;
    }
    if (!ok || c == 0) len = 1;
    if (out.size() + len > kMaxSearchTextBytes) break;
    if (!ok || c == 0) out.push_back(' ');
    else out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace

Status CheckClaimFilter(const ClaimFilter& f) {
  auto named = [](const Status& s, const char* name) -> Status {
    if (s.ok()) return s;
    return BadParam(std::string("query parameter '") + name + "': " + s.message());
  };
  if (f.workarea_id) OML_RETURN_IF_ERROR(named(fields::CheckWorkareaId(*f.workarea_id), "workarea_id"));
  if (f.provenance) OML_RETURN_IF_ERROR(named(fields::CheckProvenance(*f.provenance), "provenance"));
  if (f.simulation_id) OML_RETURN_IF_ERROR(named(fields::CheckSimulationId(*f.simulation_id), "simulation_id"));
  if (f.state && *f.state != "held" && *f.state != "promoted" && *f.state != "rejected" && *f.state != "demoted" &&
      *f.state != "erased" && *f.state != "retracted")
    return BadParam("query parameter 'state' must be one of held, promoted, rejected, demoted, erased, retracted");
  using TimeParam = std::pair<const std::optional<std::string>*, const char*>;
  for (const auto& [v, name] : {TimeParam{&f.submitted_after, "submitted_after"},
                                TimeParam{&f.submitted_before, "submitted_before"}})
    if (*v && ((*v)->size() > 64 || !Rfc3339(**v)))
      return BadParam(std::string("query parameter '") + name +
                      "' must be an RFC 3339 time such as 2025-01-31T12:00:00Z or 2025-01-31T13:00:00.25%2B01:00");
  return Status::Ok();
}

Result<RecallPage> ListClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                              const ClaimFilter& filter, int limit, const std::string& cursor) {
  OML_RETURN_IF_ERROR(CheckClaimFilter(filter));
  OML_RETURN_IF_ERROR(CheckLimit(limit));
  const std::string binding = Binding(caller, ListQueryJson(filter));
  OML_ASSIGN_OR_RETURN(std::optional<Position> pos, DecodeCursor(cursor_keys, cursor, binding, false));
  OML_ASSIGN_OR_RETURN(db::Rows r, InSnapshot(pool, caller, [&](db::Conn& conn) {
                         return ListPage(conn, caller, filter, limit, pos, nullptr);
                       }));
  RecallPage page;
  for (int i = 0; i < r.size() && i < limit; ++i) page.claims.push_back(RowToClaim(r, i));
  if (r.size() > limit) {
    const ClaimMeta& last = page.claims.back().meta;
    page.next_cursor = EncodeCursor(cursor_keys, binding, {last.submitted_seq, last.artifact_id, ""}, false);
  }
  return page;
}

Result<RecallPage> SearchClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                                const std::string& query, int limit, const std::string& cursor) {
  OML_RETURN_IF_ERROR(CheckQueryText(query));
  OML_RETURN_IF_ERROR(CheckLimit(limit));
  const std::string binding = Binding(caller, SearchQueryJson(query));
  OML_ASSIGN_OR_RETURN(std::optional<Position> pos, DecodeCursor(cursor_keys, cursor, binding, true));
  OML_ASSIGN_OR_RETURN(db::Rows r, InSnapshot(pool, caller, [&](db::Conn& conn) {
                         return Run(conn, BuildSearch(caller, query, limit, pos), false);
                       }));
  RecallPage page;
  std::string last_rank;
  for (int i = 0; i < r.size() && i < limit; ++i) {
    RecalledClaim c = RowToClaim(r, i);
    last_rank = r.Get(i, kColumnCount);
    c.rank = std::strtod(last_rank.c_str(), nullptr);
    page.claims.push_back(std::move(c));
  }
  if (r.size() > limit) {
    const ClaimMeta& last = page.claims.back().meta;
    page.next_cursor = EncodeCursor(cursor_keys, binding, {last.submitted_seq, last.artifact_id, last_rank}, true);
  }
  return page;
}

Result<std::string> ExplainListClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                                      const ClaimFilter& filter, int limit, const std::string& cursor) {
  OML_RETURN_IF_ERROR(CheckClaimFilter(filter));
  OML_RETURN_IF_ERROR(CheckLimit(limit));
  OML_ASSIGN_OR_RETURN(std::optional<Position> pos,
                       DecodeCursor(cursor_keys, cursor, Binding(caller, ListQueryJson(filter)), false));
  std::string plan;
  OML_ASSIGN_OR_RETURN(db::Rows r, InSnapshot(pool, caller, [&](db::Conn& conn) {
                         return ListPage(conn, caller, filter, limit, pos, &plan);
                       }));
  return plan + PlanText(r);
}

Result<std::string> ExplainSearchClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                                        const std::string& query, int limit, const std::string& cursor) {
  OML_RETURN_IF_ERROR(CheckQueryText(query));
  OML_RETURN_IF_ERROR(CheckLimit(limit));
  OML_ASSIGN_OR_RETURN(std::optional<Position> pos,
                       DecodeCursor(cursor_keys, cursor, Binding(caller, SearchQueryJson(query)), true));
  OML_ASSIGN_OR_RETURN(db::Rows r, InSnapshot(pool, caller, [&](db::Conn& conn) {
                         return Run(conn, BuildSearch(caller, query, limit, pos), true);
                       }));
  return PlanText(r);
}

db::Stmt SearchTextFold(const std::string& tenant, const std::string& artifact_id, int version, std::string_view text,
                        const std::string& part) {
  // One row per chunk of kSearchChunkChars characters, each also holding the 256 characters after
  // it; guarded: the version must be promoted (zero rows divides by zero). The chunks are cut
  // here, at character boundaries, in one pass, and sent as one text[]: cutting them in SQL with
  // substr() walks the UTF-8 string from its start for every chunk (quadratic: 2.6 s of
  // PostgreSQL CPU for an 8 MiB text, docs/performance.md "Uploads and attachments").
  const std::string fit = FitText(text);
  constexpr uint64_t kChunk = kSearchChunkChars, kOverlap = 256;
  std::vector<std::pair<size_t, size_t>> spans;  // byte ranges, in chunk order
  std::deque<std::pair<size_t, uint64_t>> open;  // (first byte, character index it ends at)
  uint64_t c = 0;  // character index at byte b
  for (size_t b = 0;; ++c) {
    while (!open.empty() && open.front().second == c) {
      spans.emplace_back(open.front().first, b);
      open.pop_front();
    }
    if (b >= fit.size()) break;
    if (c % kChunk == 0) open.emplace_back(b, c + kChunk + kOverlap);
    ++b;
    while (b < fit.size() && (static_cast<unsigned char>(fit[b]) & 0xC0) == 0x80) ++b;  // FitText: valid UTF-8
  }
  for (const auto& o : open) spans.emplace_back(o.first, fit.size());
  if (spans.empty()) spans.emplace_back(0, 0);  // an empty text is one (empty) row
  std::vector<std::string> chunks;
  chunks.reserve(spans.size());
  for (const auto& [from, to] : spans) chunks.push_back(fit.substr(from, to - from));
  const std::string array = db::TextArrayLiteral(chunks);  // FitText removed NUL bytes
  static const std::string kSql =
      "WITH i AS (INSERT INTO oml.claim_text (tenant_id, artifact_id, version, part, chunk, tsv) "
      "SELECT a.tenant_id, a.artifact_id, a.version, $4, c.n::integer, to_tsvector('pg_catalog.simple', c.t) "
      "FROM oml.artifacts a, unnest($5::text[]) WITH ORDINALITY AS c(t, n) "
      "WHERE a.tenant_id = $1 AND a.artifact_id = $2 AND a.version = $3 AND a.state = 'promoted' RETURNING 1) "
      "SELECT 1/count(*) FROM i";
  return {kSql, {db::Text(tenant), db::Text(artifact_id), db::Int(version), db::Text(part), db::Text(array)},
          "oml_search_text_insert"};
}

}  // namespace oml::admission
