#include "lake/rederive.h"

#include <limits>

#include "crypto/crypto.h"
#include "journal/bronze_row.h"

namespace oml::lake {
namespace {

constexpr char kBronzeTable[] = "bronze/events";
constexpr char kSilverTable[] = "silver/claims";
constexpr char kGoldTable[] = "gold/daily_activity";

}  // namespace

// ---- dead letters ------------------------------------------------------------------------------

Status DeadLetterIndex::Load(db::Conn& c, const std::string& stream, const std::string& only_tenant) {
  // Payload members are read only from silver rows, and only when they have the right JSON type
  // (a dead letter's row may be malformed).
  OML_ASSIGN_OR_RETURN(
      db::Rows dl,
      c.Query("SELECT id, outbox_seq, tenant_id::text, target_table, journal_seq, coalesce(skipped_seq, 0), error, "
              "requeued_at IS NOT NULL, coalesce(requeued_outbox_seq, 0), array_to_string(applied_tables, ','), "
              "CASE WHEN target_table = 'silver/claims' AND jsonb_typeof(payload_ref->'artifact_id') = 'string' "
              "THEN payload_ref->>'artifact_id' ELSE '' END, "
              "CASE WHEN target_table = 'silver/claims' AND jsonb_typeof(payload_ref->'version') = 'number' "
              "THEN (payload_ref->>'version')::numeric::bigint ELSE 0 END "
              "FROM oml.dead_letter WHERE stream = $1 AND ($2 = '' OR tenant_id::text = $2) ORDER BY id",
              {db::Text(stream), db::Text(only_tenant)}));
  for (int i = 0; i < dl.size(); ++i) {
    DeadLetterRecord d;
    d.id = dl.GetInt(i, 0);
    d.outbox_seq = dl.GetInt(i, 1);
    d.tenant = dl.Get(i, 2);
    d.target = dl.Get(i, 3);
    d.journal_seq = dl.GetInt(i, 4);
    d.skipped_seq = dl.GetInt(i, 5);
    d.error = dl.Get(i, 6);
    d.requeued = dl.Get(i, 7) == "t";
    d.requeued_outbox_seq = dl.GetInt(i, 8);
    for (auto& t : SplitTableList(dl.Get(i, 9))) d.applied.insert(std::move(t));
    d.artifact_id = dl.Get(i, 10);
    d.version = dl.GetInt(i, 11);
    if (d.requeued_outbox_seq > 0) requeue_rows_.insert(d.requeued_outbox_seq);
    // A row's dead letters in order: a requeued row can be dead-lettered again.
    by_row_[{d.target, RowKey{d.tenant, d.journal_seq, d.artifact_id, d.version}}].push_back(d);
    letters_.push_back(std::move(d));
  }
  return Status::Ok();
}

const std::vector<DeadLetterRecord>* DeadLetterIndex::Find(const std::string& target, const RowKey& k) const {
  auto it = by_row_.find({target, k});
  return it == by_row_.end() ? nullptr : &it->second;
}

bool DeadLetterIndex::DeliveredThrough(const std::string& target, const RowKey& k, const std::string& table,
                                       int64_t txn) const {
  const std::vector<DeadLetterRecord>* d = Find(target, k);
  if (d == nullptr) return true;
  for (const DeadLetterRecord& x : *d)
    if (x.applied.count(table) && x.outbox_seq <= txn) return true;
  // The newest dead letter is the row's last word: a requeued row that was dead-lettered again
  // has one of its own.
  const DeadLetterRecord& newest = d->back();
  return newest.requeued && newest.requeued_outbox_seq <= txn;
}

// ---- silver/claims ------------------------------------------------------------------------------

std::vector<journal::ArtifactKey> SilverKeysTouched(const journal::ChainFold& fold, const journal::Envelope& e) {
  std::vector<journal::ArtifactKey> out;
  const nlohmann::json& p = e.payload;
  auto str = [&](const char* k) { return p.contains(k) && p[k].is_string() ? p[k].get<std::string>() : std::string(); };
  if (e.type == "claim.promoted" || e.type == "claim.demoted") {
    if (p.contains("version") && p["version"].is_number_integer())
      out.emplace_back(str("artifact_id"), p["version"].get<int64_t>());
  } else if (e.type == "artifact.erased") {
    const std::string id = str("artifact_id");
    for (auto it = fold.artifacts.lower_bound({id, std::numeric_limits<int64_t>::min()});
         it != fold.artifacts.end() && it->first.first == id; ++it)
      if (it->second.erased_seq == 0) out.push_back(it->first);
  } else if (e.type == "claim.reassigned") {
    const std::string id = str("artifact_id");
    if (p.contains("versions") && p["versions"].is_array())
      for (const auto& v : p["versions"])
        if (v.is_number_integer()) out.emplace_back(id, v.get<int64_t>());
  } else if (e.type == "simulation.ended") {
    const std::string sim = str("simulation_id");
    for (const auto& [k, a] : fold.artifacts)
      if (a.simulation_id == sim && a.erased_seq == 0) out.push_back(k);
  }
  return out;
}

nlohmann::json SilverClaimRow(const std::string& tenant, const journal::ArtifactKey& k, const journal::ArtifactRow& a,
                              int64_t seq) {
  return {{"tenant_id", tenant},
          {"artifact_id", k.first},
          {"version", k.second},
          {"workarea_id", a.workarea_id},
          {"path", a.path},
          {"writer_key_id", a.writer_key_id},
          {"principal", a.principal},
          {"provenance", a.simulation_id ? std::string("simulation") : a.provenance},
          {"simulation_id", a.simulation_id ? nlohmann::json(*a.simulation_id) : nlohmann::json(nullptr)},
          {"plaintext_sha256", a.plaintext_sha256},
          {"ciphertext_sha256", a.ciphertext_sha256},
          {"media_type", a.media_type},
          {"size_bytes", a.size_bytes},
          {"state", a.state},
          {"last_event_seq", seq},
          {"submitted_at", a.submitted_at},
          {"promoted_at", a.promoted_at},
          {"state_changed_at", a.state_at}};
}

std::string BodyLocation(std::string_view location, std::string_view object_key, std::string_view state) {
  if (location.empty() || location == "postgres") return "postgres:oml.artifact_bodies";
  return std::string(state == "erased" ? "none:" : "bodies:") + std::string(object_key);
}

// ---- what was pruned ----------------------------------------------------------------------------

Result<PruneMarks> ReadPruneMarks(db::Conn& c, const std::string& stream) {
  PruneMarks m;
  OML_ASSIGN_OR_RETURN(db::Rows p, c.Query("SELECT pruned_through, rows_pruned FROM oml.outbox_prune WHERE stream = $1",
                                           {db::Text(stream)}));
  if (p.size() == 1) {
    m.pruned_through = p.GetInt(0, 0);
    m.rows_pruned = p.GetInt(0, 1);
  }
  OML_ASSIGN_OR_RETURN(db::Rows t, c.Query("SELECT tenant_id::text, bronze_through, silver_through "
                                           "FROM oml.outbox_prune_tenant WHERE stream = $1 ORDER BY tenant_id",
                                           {db::Text(stream)}));
  for (int i = 0; i < t.size(); ++i) m.tenants[t.Get(i, 0)] = {t.GetInt(i, 1), t.GetInt(i, 2)};
  return m;
}

namespace {

// Buffers rows and hands them to the sink max_rows at a time, always keeping at least one back
// until Finish, so the sink's last call is never an empty one after a full chunk.
class Chunker {
 public:
  Chunker(const RowSink& sink, int max_rows) : sink_(sink), max_(std::max(1, max_rows)) {}
  Status Add(OutboxRow row) {
    buf_.push_back(std::move(row));
    if (static_cast<int>(buf_.size()) <= max_) return Status::Ok();
    std::vector<OutboxRow> chunk(std::make_move_iterator(buf_.begin()), std::make_move_iterator(buf_.begin() + max_));
    buf_.erase(buf_.begin(), buf_.begin() + max_);
    return sink_(std::move(chunk), false);
  }
  Status Finish() { return sink_(std::move(buf_), true); }

 private:
  const RowSink& sink_;
  const int max_;
  std::vector<OutboxRow> buf_;
};

OutboxRow RowOf(const std::string& tenant, const std::string& target, int64_t journal_seq, std::string data) {
  OutboxRow r;
  r.seq = 0;
  r.tenant_id = tenant;
  r.target_table = target;
  r.journal_seq = journal_seq;
  r.row_data = std::move(data);
  return r;
}

}  // namespace

Status Rederive(const std::string& table, const PruneMarks& marks, const DeadLetterIndex& dead,
                const JournalFeed& feed, const BodyLocations& bodies, int max_rows, const RowSink& sink) {
  if (table != kBronzeTable && table != kSilverTable && table != kGoldTable)
    return InvalidArgument("no lake table '" + table + "' to re-derive", "unknown-lake-table");
  const bool silver = table == kSilverTable;
  const int page = std::clamp(max_rows, 1, 10000);
  Chunker out(sink, max_rows);
  for (const auto& [tenant, marked] : marks.tenants) {
    const int64_t mark = silver ? marked.silver : marked.bronze;
    journal::ChainFold fold(tenant == journal::kProviderTenant);
    // silver: per claim version, the newest delivered row (as of its event) and that event.
    std::map<journal::ArtifactKey, std::pair<nlohmann::json, int64_t>> newest;
    for (int64_t after = 0; after < mark;) {
      OML_ASSIGN_OR_RETURN(std::vector<FeedEvent> evs, feed(tenant, after, page));
      if (evs.empty()) {
        return DataLoss("tenant " + tenant + ": the journal ends at seq " + std::to_string(after) +
                            ", below the pruned mark " + std::to_string(mark) + " (run `oml verify`)",
                        "journal-unreadable");
      }
      for (FeedEvent& ev : evs) {
        if (ev.seq > mark) break;  // the feed goes up to the higher of the two marks
        const std::string where = "tenant " + tenant + " seq " + std::to_string(ev.seq);
        if (ev.seq != after + 1)
          return DataLoss(where + ": the journal skips from seq " + std::to_string(after) + " (run `oml verify`)",
                          "journal-unreadable");
        after = ev.seq;
        if (crypto::Sha256(ev.signed_bytes) != ev.event_hash)
          return DataLoss(where + ": signed bytes do not hash to the event hash (run `oml verify`)",
                          "journal-unreadable");
        auto env = journal::Envelope::FromSignedBytes(ev.signed_bytes);
        if (!env.ok() || env->tenant != tenant || env->seq != ev.seq)
          return DataLoss(where + ": the signed bytes are not this event's envelope (run `oml verify`)",
                          "journal-unreadable");
        if (!silver) {
          if (!dead.DeliveredThrough(kBronzeTable, RowKey{tenant, ev.seq, "", 0}, table, marks.pruned_through))
            continue;
          OML_RETURN_IF_ERROR(out.Add(RowOf(
              tenant, kBronzeTable, ev.seq, journal::BronzeRow(*env, ev.event_hash, ev.signed_bytes, ev.signature).dump())));
          continue;
        }
        const std::vector<journal::ArtifactKey> touched = SilverKeysTouched(fold, *env);
        if (Status s = fold.Apply(ev.seq, *env); !s.ok())
          return DataLoss(where + ": the payload cannot be folded (" + s.message() + "; run `oml verify --folds`)",
                          "journal-unreadable");
        for (const auto& k : touched) {
          auto a = fold.artifacts.find(k);
          if (a == fold.artifacts.end() || a->second.promoted_seq == 0) continue;  // never promoted: no row
          if (!dead.DeliveredThrough(kSilverTable, RowKey{tenant, ev.seq, k.first, k.second}, table,
                                     marks.pruned_through))
            continue;
          newest[k] = {SilverClaimRow(tenant, k, a->second, ev.seq), ev.seq};
        }
      }
    }
    if (!silver || newest.empty()) continue;
    OML_ASSIGN_OR_RETURN(auto where, bodies(tenant));
    for (auto& [k, row_seq] : newest) {
      auto& [row, seq] = row_seq;
      auto b = where.find(k);
      row["body_location"] = b == where.end() ? BodyLocation("", "", "")
                                              : BodyLocation(b->second.first, b->second.second,
                                                             row["state"].get<std::string>());
      OML_RETURN_IF_ERROR(out.Add(RowOf(tenant, kSilverTable, seq, row.dump())));
    }
  }
  return out.Finish();
}

}  // namespace oml::lake
