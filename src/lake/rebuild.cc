#include "lake/rebuild.h"

#include "common/log.h"
#include "lake/delta_tables.h"
#include "lake/lakewriter.h"

namespace oml::lake {

namespace {
// Conditional commits tried before giving up: each loses only to a commit that landed between
// its refresh and its commit (a batch of the running writer), so a few always suffice.
constexpr int kMaxAttempts = 20;
}  // namespace

Result<RebuildStart> StartRebuild(db::Conn& conn, const OutboxStream& s, const std::string& lake_root,
                                  const std::string& table) {
  bool known = false;
  for (const auto& t : TargetTables()) known = known || t.name == table;
  if (!known) {
    std::string names;
    for (const auto& t : TargetTables()) names += (names.empty() ? "" : ", ") + t.name;
    return InvalidArgument("no lake table " + table + " (the tables are " + names + ")", "unknown-lake-table");
  }
  const std::string uri = TableUri(lake_root, table);
  // A table whose log holds a damaged commit below an intact one is opened as deltalake-core reads
  // it (the damaged version empty): emptied and checkpointed below, the damage falls below the
  // newest checkpoint, where nothing reads it again.
  auto opened = DeltaTable::Open(uri);
  bool damaged = false;
  if (!opened.ok() && opened.status().type() == "lake-commit-damaged") {
    damaged = true;
    opened = DeltaTable::OpenUnchecked(uri);
    if (!opened.ok())
      return FailedPrecondition("lake table " + table + " cannot be read (" + opened.status().message() +
                                    "): stop the lake writer, move " + uri +
                                    " aside, run `oml init` and start the writer (it refills the new table)",
                                "lake-log-unreadable");
  }
  if (!opened.ok()) {
    if (opened.status().code() == Code::kNotFound)
      return FailedPrecondition("lake table " + table + " does not exist at " + uri + " (run `oml init`)",
                                "lake-table-missing");
    return opened.status();
  }
  RebuildStart out;
  out.table = table;
  // Step 1: the record first, at least the frontier (greatest(): a concurrent frontier advance
  // may already have recorded more than the F this statement read). A crash before step 2 leaves
  // a record the table may not reach: the writer then re-reads (its txn, F], commits nothing T
  // already holds (the txn check), and records the txn T holds (LakeWriter::Recover).
  OML_ASSIGN_OR_RETURN(
      db::Rows f,
      conn.Query("WITH f AS (SELECT frontier_seq FROM oml.lake_frontier WHERE stream = $1) "
                 "INSERT INTO oml.lake_table_txn (stream, table_name, txn_version) "
                 "SELECT $1, $2, frontier_seq FROM f "
                 "ON CONFLICT (stream, table_name) DO UPDATE "
                 "SET txn_version = greatest(lake_table_txn.txn_version, excluded.txn_version), updated_at = now() "
                 "RETURNING (SELECT frontier_seq FROM f)",
                 {db::Text(s.name), db::Text(table)}));
  if (f.size() != 1) return NotFound("no outbox stream " + s.name + " (oml.lake_frontier)", "unknown-stream");
  out.frontier = f.GetInt(0, 0);
  // Step 2: empty T and reset the stream's txn, on T's newest version.
  DeltaTable& t = *opened;
  const TxnCommit commit{AppIdFor(s.name), 0,
                         {{"oml.stream", s.name}, {"oml.rebuild", true}, {"oml.rebuild_frontier", out.frontier}}};
  for (;;) {
    ++out.attempts;
    OML_RETURN_IF_ERROR(t.Refresh().status());
    auto v = t.Truncate(commit);
    if (v.ok()) {
      out.truncated_version = *v;
      break;
    }
    const bool conflict = v.status().code() == Code::kAborted && v.status().type() == "lake-commit-conflict";
    if (!conflict || out.attempts >= kMaxAttempts) return v.status();
  }
  if (damaged) {
    // The damaged commit is now below this checkpoint: opens read from here on.
    OML_RETURN_IF_ERROR(t.Checkpoint().status());
    out.damage_checkpointed = true;
  }
  log::Info("lake rebuild: table emptied; the lake writer refills it from the outbox",
            {{"stream", s.name}, {"table", table}, {"version", out.truncated_version}, {"frontier", out.frontier},
             {"attempts", out.attempts}});
  return out;
}

}  // namespace oml::lake
