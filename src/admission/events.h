// Events: who may read which events of a tenant's chain (GET /v1/events).
//
// The journal carries, in its signed bytes, the metadata of every claim: artifact id, path,
// workarea, principal, digests. The own-work rule (claims.h: a held or erased claim exists only
// for its author, reviewers and admins; 404 for anyone else) must hold for the chain too, so
// what an events page shows depends on the caller's role:
//
//   role               sees
//   admin, reviewer    every event of the tenant's chain
//   writer (and any    only the events that concern it, found through the fold tables:
//   other role)          claim.submitted  of a claim it may read (GET /v1/claims/{id} does not
//                                         answer 404): its own (artifacts.principal = its
//                                         principal), or one whose state is promoted (not held,
//                                         rejected, demoted, retracted or erased);
//                        artifact.erased  of its own claims (whoever erased them);
//                        api_key.created, api_key.revoked of its own API keys
//                                         (api_keys.principal = its principal).
//                      Nothing else: chain.genesis and every other event type are hidden.
//
// "Own" is the same notion as Claims::Fetch: the principal of the caller's API key, so two keys
// of one principal see the same events. Every event a writer can author today (claim.submitted,
// artifact.erased of its own claim) is in that list; a new event type is hidden from writers
// until a rule here admits it (fail closed). The review events (claim.promoted, claim.rejected,
// claim.demoted: reviewers' and admins' acts) are not admitted yet, not even for the author's own
// claims: the author sees the outcome as the claim's state (GET /v1/claims/{id}).
//
// A writer's page is therefore not a contiguous piece of the chain: prev_hash links to events it
// cannot see. Each event still verifies on its own (signature over signed_bytes, event_hash =
// SHA-256 of them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "admission/claims.h"
#include "common/status.h"
#include "db/conn.h"

namespace oml::admission {

struct EventRow {
  int64_t seq = 0;
  std::string prev_hash;     // raw 32 bytes
  std::string event_hash;    // raw 32 bytes
  std::string type;          // event_type, e.g. "claim.submitted"
  std::string key_id;        // signing key id
  std::string signed_bytes;  // canonical envelope bytes, byte-exact
  std::string signature;     // raw 64 bytes
  std::string committed_at;  // "YYYY-MM-DDTHH:MM:SS.ffffffZ" (UTC)
};

struct EventsPage {
  std::vector<EventRow> events;  // ascending seq, all > after
  // Where the next page starts (pass it as `after`). The last seq this page covered: the last
  // event returned when the page was cut short (by `limit` or by bytes); otherwise, when every
  // visible event up to the chain head was returned, the head's seq, so that a writer's paging
  // moves past the events it may not see. Never less than `after`.
  int64_t next_after = 0;
};

// One page of the caller's tenant's chain: the events after seq `after` that `caller` may see
// (rule above), at most `limit` of them and, counting signed_bytes plus signature of each,
// at most `max_page_bytes`, except that the first event is always returned however large.
// Read in one REPEATABLE READ snapshot, scoped to caller.tenant_id (row-level security).
// REQUIRES: after >= 0, limit >= 1, max_page_bytes >= 1.
// Errors: the database's (db/conn.h), e.g. kUnavailable "database-busy".
Result<EventsPage> ListEvents(db::Pool& pool, const Caller& caller, int64_t after, int limit, size_t max_page_bytes);

// True iff `caller` sees every event of its tenant's chain (admin, reviewer).
bool SeesWholeChain(const Caller& caller);

}  // namespace oml::admission
