#include "lake/dead_letter.h"

#include <algorithm>

#include "common/log.h"
#include "journal/bronze_row.h"

namespace oml::lake {
namespace {

constexpr size_t kMaxErrorChars = 1000;

// The error as it goes into the signed payload: single-line, bounded. It names the reason the row
// did not fit (a column, a type) and never carries row data.
std::string PayloadError(const std::string& error) {
  std::string out = error.substr(0, kMaxErrorChars);
  std::replace_if(out.begin(), out.end(), [](unsigned char ch) { return ch < 0x20; }, ' ');
  return out;
}

}  // namespace

Result<DeadLetterResult> DeadLetterRow(db::Conn& conn, const crypto::SigningKey& key, const std::string& stream,
                                       int64_t epoch, const OutboxRow& row, const std::string& error,
                                       int attempts, const std::vector<std::string>& applied_tables) {
  OML_RETURN_IF_ERROR(conn.Exec("BEGIN").status());
  auto rollback = [&](Status st) -> Status {
    (void)conn.Exec("ROLLBACK");
    return st;
  };
  auto head = conn.Query(
      "SELECT tenant_id::text, head_seq, head_hash, coalesce(head_time, ''), coalesce(key_in_force, ''), "
      "target_table, journal_seq FROM oml.lake_dead_letter_begin($1, $2, $3)",
      {db::Text(stream), db::Int(epoch), db::Int(row.seq)});
  if (!head.ok()) return rollback(head.status());
  if (head->size() != 1 || head->IsNull(0, 2) || head->GetInt(0, 1) < 1) {
    return rollback(FailedPrecondition("the tenant of outbox seq " + std::to_string(row.seq) + " has no chain",
                                       "chain-missing"));
  }
  if (head->Get(0, 4) != key.key_id()) {
    return rollback(FailedPrecondition("the lake writer's signing key " + key.key_id() +
                                           " is not the key in force (" + head->Get(0, 4) +
                                           "); a dead letter cannot be journalled",
                                       "signing-key-not-in-force"));
  }
  journal::Envelope e;
  e.tenant = head->Get(0, 0);
  e.seq = head->GetInt(0, 1) + 1;
  e.prev_hash = head->GetBytes(0, 2);
  e.type = "materialize-skipped";
  e.time = std::max(journal::NowTimestamp(), head->Get(0, 3));
  e.key_id = key.key_id();
  e.principal = kLakeWriterPrincipal;
  e.payload = {{"stream", stream},
               {"outbox_seq", row.seq},
               {"target_table", head->Get(0, 5)},
               {"journal_seq", head->GetInt(0, 6)},
               {"error", PayloadError(error)},
               {"attempts", attempts},
               {"applied_tables", applied_tables}};
  auto rc = journal::SignEnvelope(e, key);
  if (!rc.ok()) return rollback(rc.status());
  const nlohmann::json bronze = journal::BronzeRow(e, rc->event_hash, rc->signed_bytes, rc->signature);
  auto id = conn.Query(
      "SELECT oml.lake_dead_letter_commit($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12::text[])",
      {db::Text(stream), db::Int(epoch), db::Int(row.seq), db::Int(e.seq), db::Bytes(e.prev_hash),
       db::Bytes(rc->event_hash), db::Bytes(rc->signed_bytes), db::Bytes(rc->signature), db::Text(bronze.dump()),
       db::Text(error), db::Int(attempts), db::TextArray(applied_tables)});
  if (!id.ok()) return rollback(id.status());
  auto commit = conn.Exec("COMMIT");
  if (!commit.ok()) return commit.status();
  OML_RETURN_IF_ERROR(conn.CommitVerdict(*commit));
  DeadLetterResult out;
  out.id = id->GetInt(0, 0);
  out.receipt = std::move(rc).value();
  return out;
}

Result<DeadLetters> DeadLetteredSeqs(db::Conn& conn, const std::string& stream, int64_t from_exclusive,
                                     int64_t to_inclusive) {
  OML_ASSIGN_OR_RETURN(db::Rows r,
                       conn.Query("SELECT outbox_seq, coalesce(array_to_string(applied_tables, ','), '') "
                                  "FROM oml.dead_letter WHERE stream = $1 AND outbox_seq > $2 AND outbox_seq <= $3",
                                  {db::Text(stream), db::Int(from_exclusive), db::Int(to_inclusive)}));
  DeadLetters out;
  for (int i = 0; i < r.size(); ++i) {
    out[r.GetInt(i, 0)] = SplitTableList(r.Get(i, 1));
  }
  return out;
}

namespace {

// Dead letters of `stream` as JSON objects, oldest first; only the one with `id` if id > 0.
Result<std::vector<nlohmann::json>> SelectDeadLetters(db::Conn& conn, const std::string& stream, int64_t id) {
  OML_ASSIGN_OR_RETURN(
      db::Rows r,
      conn.Query("SELECT id, outbox_seq, tenant_id::text, target_table, journal_seq, error, attempts, skipped_seq, "
                 "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
                 "to_char(requeued_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
                 "requeued_seq, requeued_outbox_seq, array_to_json(applied_tables)::text FROM oml.list_dead_letters($1) WHERE $2 <= 0 OR id = $2",
                 {db::Text(stream), db::Int(id)}));
  std::vector<nlohmann::json> out;
  auto opt_int = [&](int i, int c) -> nlohmann::json { return r.IsNull(i, c) ? nlohmann::json() : nlohmann::json(r.GetInt(i, c)); };
  auto opt_text = [&](int i, int c) -> nlohmann::json { return r.IsNull(i, c) ? nlohmann::json() : nlohmann::json(r.Get(i, c)); };
  for (int i = 0; i < r.size(); ++i) {
    out.push_back({{"id", r.GetInt(i, 0)},
                   {"outbox_seq", r.GetInt(i, 1)},
                   {"tenant_id", r.Get(i, 2)},
                   {"target_table", r.Get(i, 3)},
                   {"journal_seq", r.GetInt(i, 4)},
                   {"error", r.Get(i, 5)},
                   {"attempts", r.GetInt(i, 6)},
                   {"skipped_seq", opt_int(i, 7)},
                   {"created_at", r.Get(i, 8)},
                   {"requeued_at", opt_text(i, 9)},
                   {"requeued_seq", opt_int(i, 10)},
                   {"requeued_outbox_seq", opt_int(i, 11)},
                   {"applied_tables", nlohmann::json::parse(r.Get(i, 12))}});
  }
  return out;
}

}  // namespace

Result<std::vector<nlohmann::json>> ListDeadLetters(db::Conn& conn, const std::string& stream) {
  return SelectDeadLetters(conn, stream, 0);
}

Result<RequeueResult> RequeueDeadLetter(journal::Journal& journal, const std::string& stream, int64_t id,
                                        const std::string& principal) {
  auto find = [&]() -> Result<nlohmann::json> {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle h, journal.pool().Acquire());
    OML_ASSIGN_OR_RETURN(std::vector<nlohmann::json> one, SelectDeadLetters(*h, stream, id));
    if (one.size() == 1) return one[0];
    return NotFound("no dead letter " + std::to_string(id) + " in stream " + stream, "dead-letter-not-found");
  };
  OML_ASSIGN_OR_RETURN(nlohmann::json dl, find());
  if (!dl["requeued_at"].is_null()) {
    return FailedPrecondition("dead letter " + std::to_string(id) + " was requeued already (event seq " +
                                  dl["requeued_seq"].dump() + ", outbox seq " + dl["requeued_outbox_seq"].dump() + ")",
                              "dead-letter-requeued");
  }
  journal::EventSpec ev;
  ev.type = "materialize-requeued";
  ev.principal = principal;
  ev.payload = {{"stream", stream},
                {"dead_letter_id", id},
                {"outbox_seq", dl["outbox_seq"]},
                {"target_table", dl["target_table"]},
                {"journal_seq", dl["journal_seq"]},
                {"skipped_seq", dl["skipped_seq"]}};
  ev.fold = [id](int64_t seq) {
    return std::vector<db::Stmt>{{"SELECT oml.requeue_dead_letter($1, $2)", {db::Int(id), db::Int(seq)}}};
  };
  auto rc = journal.Append(dl["tenant_id"].get<std::string>(), ev);
  if (!rc.ok()) {
    // A concurrent requeue of the same id won: its fold raised unique_violation in ours.
    if (rc.status().code() == Code::kFailedPrecondition && rc.status().type() == "conflict") {
      return FailedPrecondition("dead letter " + std::to_string(id) + " was requeued already", "dead-letter-requeued");
    }
    return rc.status();
  }
  OML_ASSIGN_OR_RETURN(nlohmann::json after, find());
  RequeueResult out;
  out.receipt = std::move(rc).value();
  out.outbox_seq = after["requeued_outbox_seq"].is_number_integer() ? after["requeued_outbox_seq"].get<int64_t>() : 0;
  log::Info("dead letter requeued", {{"id", id}, {"stream", stream}, {"seq", out.receipt.seq},
                                     {"outbox_seq", out.outbox_seq}});
  return out;
}

}  // namespace oml::lake
