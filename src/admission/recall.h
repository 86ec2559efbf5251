// Recall and search: listing a tenant's claims and full-text search over promoted text, answered
// from PostgreSQL only (sql/0012_recall.sql), never from the lake. Only metadata and digests are
// returned, never a body.
//
// Who sees what: the own-work rule of claims.cc (HiddenFrom), the same as GET /v1/claims/{id}, so
// a claim is listed exactly when its fetch would not answer 404:
//
//   claim state   writer (author)   writer (anyone else)   reviewer, admin
//   held          listed            -                      listed
//   rejected      listed            -                      listed
//   demoted       listed            -                      listed
//   retracted     listed            -                      listed   (simulation ended: lifecycle.h)
//   promoted      listed            listed                 listed
//   erased        state=erased      -                      state=erased
//
// Erased claims are tombstones (a fetch answers 410): a list leaves them out unless the filter
// asks for state=erased; then those the caller may see are listed with their erasure seq. Search
// finds promoted claims only (the index holds nothing else), for every caller of the tenant.
//
// Order and paging. A list is ordered newest submission first, (submitted_seq DESC, artifact_id
// DESC): submitted_seq is the seq of the version's claim.submitted, fixed for ever, so the order
// of two claims never changes. A search is ordered by rank (ts_rank of the best matching chunk,
// deterministic for a given text and query) DESC, then the same keys. Pages are cut by keyset:
// the cursor holds the last row's keys, and the next page starts strictly after them. Claims
// submitted (or promoted) between two pages therefore never shift a page: no row is returned
// twice and none of those present at the first page is skipped, as long as it stays visible
// (one demoted or erased in between drops out of later pages).
//
// The cursor is opaque to clients and authenticated (admission/cursor.h): HMAC-SHA-256 under the
// deployment's cursor secret (`cursor_keys`, config cursor_secret_file), and bound to the tenant
// and the query (endpoint, filters or search text). Another query or tenant, a changed byte, a
// cursor MACed under a secret the server does not hold, or anything that does not decode is
// kInvalidArgument "invalid-cursor". Even an accepted cursor only positions a page: every page is
// filtered by the caller's own visibility.
//
// Search text: 'simple' configuration (lower-cased words, no stemming, no stop words). Claims
// are written by agents and people in any language; 'english' would stem other languages wrongly
// and drop words such as "who" or "it" from both text and queries. 'simple' matches words as
// written, predictably. Queries use websearch_to_tsquery's syntax: words (all must match),
// "quoted phrases", OR, and -word to exclude.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "admission/claims.h"
#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"

namespace oml::admission {

inline constexpr int kRecallDefaultLimit = 50;
inline constexpr int kRecallMaxLimit = 500;
// A search query: 1..1000 bytes of UTF-8 without control characters.
inline constexpr size_t kMaxSearchQueryBytes = 1000;
// Text of one part beyond this many bytes (cut at a character boundary) is not indexed.
inline constexpr size_t kMaxSearchTextBytes = 8u << 20;
// Characters per claim_text chunk (sql/0012): a chunk's tsvector stays far below PostgreSQL's
// 1 MiB limit whatever the text. Each chunk also indexes the next 256 characters, so a word cut
// by the chunk boundary is still found whole (words up to 256 characters).
inline constexpr int kSearchChunkChars = 65536;

// Filters of GET /v1/claims; an absent member does not filter. All are exact matches except the
// times: submitted_after and submitted_before are exclusive bounds on the signed time of
// claim.submitted, RFC 3339 with a 'Z' or numeric offset ("2025-01-31T12:00:00Z",
// "2025-01-31T13:00:00.5+01:00").
struct ClaimFilter {
  std::optional<std::string> workarea_id, state, provenance, simulation_id, submitted_after, submitted_before;
};

struct RecalledClaim {
  ClaimMeta meta;
  std::string submitted_at;  // "YYYY-MM-DDTHH:MM:SS.ffffffZ", as signed; "" if unknown
  double rank = 0;           // search only
};

struct RecallPage {
  std::vector<RecalledClaim> claims;
  std::optional<std::string> next_cursor;  // set iff another page may follow
};

// OK, or kInvalidArgument "invalid-parameter" naming the filter: state not one of held,
// promoted, rejected, demoted, erased; workarea_id, provenance or simulation_id breaking its rule
// in fields/fields.h; a time that is not RFC 3339 (a space in place of the offset's '+' is
// taken as '+', since an unencoded '+' arrives as a space in a query string).
Status CheckClaimFilter(const ClaimFilter& f);

// One page of the caller's tenant's claims (newest version of each), `limit` at most, after
// `cursor` ("" for the first page); the next page's cursor is MACed under cursor_keys' signing
// key, and `cursor` is verified under the key it names. In one REPEATABLE READ snapshot, scoped to the tenant (RLS).
// Errors: CheckClaimFilter's; kInvalidArgument "invalid-parameter" for a limit outside
// 1..kRecallMaxLimit; "invalid-cursor"; the database's.
Result<RecallPage> ListClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                              const ClaimFilter& filter, int limit, const std::string& cursor);

// One page of the promoted claims of the caller's tenant whose text matches `query`
// (websearch_to_tsquery('simple', query)), best rank first. A query without a word finds nothing.
// Errors: kInvalidArgument "invalid-parameter" for an empty, too long, non-UTF-8 or control
// character query or a bad limit; "invalid-cursor"; the database's.
Result<RecallPage> SearchClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                                const std::string& query, int limit, const std::string& cursor);

// The fold statement that indexes `text` as part `part` of version `version` of a claim, for the
// fold of its claim.promoted event (or of a later event, while the version is promoted). Inserts
// one claim_text row per kSearchChunkChars characters (one row for an empty text).
// REQUIRES: runs after the fold's UPDATE that made the version 'promoted', in the same
// transaction; `part` matches ^[a-z][a-z0-9:._-]{0,199}$ and was not indexed yet for this version.
// Otherwise the statement fails and so does the transaction: zero-rows-guard (22012) if the
// version is not promoted, 23505 if the part is indexed already.
// The text is made fit first: cut to kMaxSearchTextBytes at a character boundary, NUL bytes and
// invalid UTF-8 sequences replaced by spaces (so extracted text from any source is accepted).
db::Stmt SearchTextFold(const std::string& tenant, const std::string& artifact_id, int version, std::string_view text,
                        const std::string& part = "body");

// EXPLAIN (COSTS OFF) of the page query ListClaims / SearchClaims would run, in the caller's
// scope: for the plan tests and for operators. Same errors as the call.
Result<std::string> ExplainListClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                                      const ClaimFilter& filter, int limit, const std::string& cursor);
Result<std::string> ExplainSearchClaims(db::Pool& pool, const crypto::HmacKeyRing& cursor_keys, const Caller& caller,
                                        const std::string& query, int limit, const std::string& cursor);

}  // namespace oml::admission
