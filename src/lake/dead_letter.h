// Dead letters of the lake writer (issue 8, "Dead letters"; sql/0010_dead_letter.sql).
//
// A poison outbox row is one the writer cannot materialize however often it retries: its target
// table is unknown to this writer, or its row_data does not fit the table. After the writer's
// retry budget (LakeWriterOptions::dead_letter_after attempts), DeadLetterRow moves it aside in
// ONE PostgreSQL transaction, as oml_lakewriter:
//   BEGIN
//   oml.lake_dead_letter_begin(stream, epoch, outbox_seq)   lease + row checks; locks the row's
//                                                           tenant chain like an append; its head
//   (client) envelope materialize-skipped at head+1, signed with the key in force
//   oml.lake_dead_letter_commit(...)                        journal row, its bronze outbox row,
//                                                           head advance, dead_letter row
//   COMMIT
// Either all of it commits or none: a crash in between leaves the row where it was, and the
// writer retries. Batches leave dead-lettered seqs out (DeadLetteredSeqs), so the frontier can pass
// them. `oml dead-letter requeue ID` (RequeueDeadLetter) re-enqueues one through a signed
// materialize-requeued event whose fold marks it requeued and enqueues its row under a new seq.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "crypto/crypto.h"
#include "db/conn.h"
#include "journal/event.h"
#include "journal/journal.h"
#include "lake/outbox_cut.h"

namespace oml::lake {

// The principal of events the lake writer journals.
inline constexpr char kLakeWriterPrincipal[] = "system:lakewriter";

// What DeadLetterRow committed.
struct DeadLetterResult {
  int64_t id = 0;               // dead_letter.id
  journal::Receipt receipt;     // the materialize-skipped event
};

// Moves `row` of `stream` to dead_letter with a signed materialize-skipped event on its tenant
// chain (see above), `error` and `attempts` recorded. `epoch` is the caller's lease epoch: the
// database refuses (SQLSTATE 42501, kInternal "database-permission-denied", "lease-lost" in the
// log detail) if the lease moved on, and nothing is written. `applied_tables` are the lake tables
// that already hold the row (LakeWriter::TablesHolding): recorded in the dead letter and the signed
// payload, and skipped by its requeue (sql/0019). `key` must be the key
// in force (else kFailedPrecondition "signing-key-not-in-force", nothing written). The
// connection must not be inside a transaction; on any failure the transaction is rolled back.
Result<DeadLetterResult> DeadLetterRow(db::Conn& conn, const crypto::SigningKey& key, const std::string& stream,
                                       int64_t epoch, const OutboxRow& row, const std::string& error,
                                       int attempts, const std::vector<std::string>& applied_tables);

// Outbox seqs of `stream` in (from_exclusive, to_inclusive] that are dead-lettered, each with the
// tables that held it when it was (applied_tables, sql/0019). A batch leaves the row out of every
// other table; those tables keep it, so a refill or a rebuild of one of them applies it again
// exactly where it was, and its requeue (which skips them) lands in the others only.
using DeadLetters = std::map<int64_t, std::vector<std::string>>;
Result<DeadLetters> DeadLetteredSeqs(db::Conn& conn, const std::string& stream, int64_t from_exclusive,
                                     int64_t to_inclusive);

// `oml dead-letter list`: every dead letter of `stream` (oldest first) as JSON objects (id,
// outbox_seq, tenant_id, target_table, journal_seq, error, attempts, skipped_seq, created_at,
// requeued_at, requeued_seq, requeued_outbox_seq, applied_tables), read through oml.list_dead_letters (conn: the
// application role).
Result<std::vector<nlohmann::json>> ListDeadLetters(db::Conn& conn, const std::string& stream);

// `oml dead-letter requeue ID`: appends materialize-requeued to the dead letter's tenant chain;
// its fold (oml.requeue_dead_letter) marks the dead letter requeued and enqueues its row again,
// in the event's transaction. kNotFound "dead-letter-not-found" for an unknown id;
// kFailedPrecondition "dead-letter-requeued" if it was requeued already (no event written).
// Returns the event's receipt and the new outbox seq.
struct RequeueResult {
  journal::Receipt receipt;
  int64_t outbox_seq = 0;
};
Result<RequeueResult> RequeueDeadLetter(journal::Journal& journal, const std::string& stream, int64_t id,
                                        const std::string& principal);

}  // namespace oml::lake
