// Lake rows re-derived from the journal, for a table that must hold rows whose outbox rows were
// pruned (issue 18: "where the outbox no longer has the rows, from rows re-derived from the
// journal"; issue 20, "Outbox pruning"). Also the expected-state code `oml reconcile` shares:
// which silver rows an event enqueues, the silver row of a claim version, body_location, and
// which tables a dead-lettered row reached.
//
// What pruning leaves (sql/0025): pruned_through P, and per tenant T two marks. A tenant's rows
// enter the outbox in chain order (an event's silver rows before its bronze row), so: the bronze
// rows of T's events 1..mb(T) are gone and every later one is still in the outbox; the silver rows
// of events below ms(T) are gone and those above it are not, while event ms(T) may have rows on
// both sides of P (P can fall inside one transaction). So the rows a table held from the pruned
// prefix are those the outbox history delivered to it of:
//   bronze/events    T's events 1..mb(T): journal::BronzeRow of each (what the commit point
//                    enqueued);
//   gold/daily_activity  the same rows, counted (the writer's DailyActivityRows);
//   silver/claims    per claim version, the row of the newest event <= ms(T) that enqueued one
//                    (SilverKeysTouched), as of that event (ChainFold replayed to it), with its
//                    body_location. A row of event ms(T) still in the outbox is applied again by
//                    the refill above P, which changes nothing: the MERGE keeps a row only when
//                    newer by chain seq.
// A row the history did not deliver to the table (dead-lettered there and not requeued at or
// below P) is left out; one requeued above P is still in the outbox, and the refill above P
// delivers it. The original outbox seq of a pruned row is not kept: a re-derived row carries
// outbox_seq 0 (docs/data/delta-tables.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "db/conn.h"
#include "journal/chain_fold.h"
#include "journal/event.h"
#include "lake/outbox_cut.h"

namespace oml::lake {

// ---- dead letters ------------------------------------------------------------------------------

struct DeadLetterRecord {
  int64_t id = 0, outbox_seq = 0, journal_seq = 0, skipped_seq = 0;
  std::string tenant, target, error, artifact_id;
  int64_t version = 0;  // silver rows: the claim version; 0 for bronze
  bool requeued = false;
  int64_t requeued_outbox_seq = 0;
  std::set<std::string> applied;  // the tables that held the row when it was dead-lettered
};

// (tenant, journal seq, artifact_id, version): one outbox row's identity within its target
// (bronze rows: artifact "" and version 0).
using RowKey = std::tuple<std::string, int64_t, std::string, int64_t>;

// Every dead letter of a stream, by the row it moved aside. Immutable after Load.
class DeadLetterIndex {
 public:
  // Reads oml.dead_letter of `stream` (every tenant, or `only_tenant`). The lake writer and the
  // reconciler roles may read it.
  Status Load(db::Conn& c, const std::string& stream, const std::string& only_tenant = "");

  // Whether the outbox history delivered row `k` of `target` to `table` through the outbox rows
  // at or below `txn`: a row never dead-lettered was delivered; a dead-lettered one reached the
  // tables it was applied to before (that dead letter's row at or below txn), or, once requeued,
  // every table, when the requeued row is at or below txn and was not dead-lettered itself.
  bool DeliveredThrough(const std::string& target, const RowKey& k, const std::string& table, int64_t txn) const;

  // The dead letters of row `k`, oldest first; nullptr if none.
  const std::vector<DeadLetterRecord>* Find(const std::string& target, const RowKey& k) const;
  // Whether outbox seq `seq` is a requeued row (a second delivery of a dead-lettered one).
  bool IsRequeueRow(int64_t seq) const { return requeue_rows_.count(seq) > 0; }
  const std::vector<DeadLetterRecord>& letters() const { return letters_; }

 private:
  std::map<std::pair<std::string, RowKey>, std::vector<DeadLetterRecord>> by_row_;
  std::set<int64_t> requeue_rows_;
  std::vector<DeadLetterRecord> letters_;
};

// ---- silver/claims ------------------------------------------------------------------------------

// The (artifact, version) keys whose silver row event `e` enqueues (sql/0009, 0014, 0015): taken
// BEFORE e is folded into `fold`, since an erasure or a simulation's end is defined on the
// versions as they were.
std::vector<journal::ArtifactKey> SilverKeysTouched(const journal::ChainFold& fold, const journal::Envelope& e);

// The silver/claims row of claim version `k` as of event `seq` (fold applied through it), every
// column but body_location and outbox_seq.
nlohmann::json SilverClaimRow(const std::string& tenant, const journal::ArtifactKey& k, const journal::ArtifactRow& a,
                              int64_t seq);

// Where the claim's ciphertext lives (sql/0015 silver_claim_row): "postgres:oml.artifact_bodies"
// for a body kept in PostgreSQL (location "postgres", or no artifact_bodies row: pass ""), else
// "bodies:<object_key>" (an accept moves the object there) or, once erased, "none:<object_key>".
// Taken from `state` as of the row's event, not from the stored location, which may already be
// a later event's (an erasure not yet delivered to the lake is lag, not a mismatch).
std::string BodyLocation(std::string_view location, std::string_view object_key, std::string_view state);

// ---- what was pruned ----------------------------------------------------------------------------

struct PruneMarks {
  struct Tenant {
    int64_t bronze = 0;  // mb(T): bronze rows of events 1..mb(T) were pruned, later ones were not
    int64_t silver = 0;  // ms(T): silver rows of events below ms(T) were pruned, above it not
  };
  int64_t pruned_through = 0;             // P: every outbox row at or below it is gone
  std::map<std::string, Tenant> tenants;  // tenant -> its marks
  int64_t rows_pruned = 0;
};

// Reads oml.outbox_prune and oml.outbox_prune_tenant of `stream` (all zero before any prune).
Result<PruneMarks> ReadPruneMarks(db::Conn& c, const std::string& stream);

// One journal event, as lake_journal_feed returns it.
struct FeedEvent {
  int64_t seq = 0;
  std::string event_hash, signed_bytes, signature;  // raw bytes
};
// The events of `tenant` with after < seq <= max(mb, ms), ascending, at most `limit`.
using JournalFeed = std::function<Result<std::vector<FeedEvent>>(const std::string& tenant, int64_t after, int limit)>;
// artifact_bodies of `tenant`: (artifact, version) -> (location, object_key).
using BodyLocations =
    std::function<Result<std::map<journal::ArtifactKey, std::pair<std::string, std::string>>>(const std::string& tenant)>;
// Receives the re-derived rows in chunks of at most max_rows; `last` is set on the final call
// only (its chunk may be empty: then there were no rows at all).
using RowSink = std::function<Status(std::vector<OutboxRow>&& rows, bool last)>;

// The rows `table` ("bronze/events", "silver/claims" or "gold/daily_activity") held from the
// pruned prefix (see the top of this file), as outbox rows (seq 0, the target table they had:
// bronze rows for bronze and gold, silver rows for silver), tenant by tenant in chain order.
// kDataLoss if an event's signed bytes do not hash to its event_hash or cannot be parsed or
// folded (run `oml verify`); nothing is emitted for that tenant's later events then.
Status Rederive(const std::string& table, const PruneMarks& marks, const DeadLetterIndex& dead,
                const JournalFeed& feed, const BodyLocations& bodies, int max_rows, const RowSink& sink);

}  // namespace oml::lake
