// `oml lake rebuild --table T`: a lake table refilled from the outbox exactly once, while the lake
// writer runs (issue 18, "Rebuilding a table").
//
// Moving a table aside and letting the writer create a new one (the procedure this replaces) gave
// a table holding only what came after the frontier. A rebuild instead:
//   1. sets T's record in oml.lake_table_txn to the frontier F (what T must hold: every row up
//      to F, since the frontier passes a batch only once every table holds it);
//   2. empties T in ONE Delta commit (DeltaTable::Truncate: every data file removed) that sets the
//      stream's txn to 0, conditional on T's newest version (a commit landing first makes it
//      retry on the new version; it never rebases, which would keep files it did not see).
// T's txn (0) is then below its record, which is exactly the state of a table that lost commits:
// the lake writer's recovery refills (0, F] from the outbox into T alone (the txn check skips the
// tables that hold those rows), exactly once, before it applies anything newer, and then records
// the txn T holds (below F when T's own rows end earlier): T is no longer behind. A running writer
// notices at its next commit to T (the commit conflicts, its txn moved back: recovery) or, idle,
// within LakeWriterOptions::table_check_every; a stopped one at its start.
//
// Readers see T empty, then growing, until the refill reaches F: the rebuild of a table that
// serves no client read. Dead letters keep their place (lake/dead_letter.h, DeadLetteredSeqs):
// a row is refilled into T exactly where it was, its requeue wherever it was not.
//
// A table whose log holds a damaged commit below an intact one (the writer stops on it,
// "lake-commit-damaged ... rebuild the table") is read as deltalake-core reads it (the damaged
// version empty), emptied the same way, and checkpointed at the emptying version, so the damaged
// commit lies below the newest checkpoint and nothing reads it again. A commit that is not JSON
// makes the table unreadable to deltalake-core too: kFailedPrecondition "lake-log-unreadable",
// naming the manual procedure (move the table aside, `oml init`, the writer refills it).
//
// Runs as the lakewriter role; needs no lease (the conditional commit is the fence).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "db/conn.h"
#include "lake/outbox_cut.h"

namespace oml::lake {

struct RebuildStart {
  std::string table;
  int64_t frontier = 0;          // F: what T is refilled up to
  int64_t truncated_version = 0;  // the Delta version of the emptying commit
  int attempts = 0;               // conditional commits tried (1 unless a commit landed first)
  bool damage_checkpointed = false;  // T's log had a damaged commit: a checkpoint now covers it
};

// Steps 1 and 2 above. kInvalidArgument "unknown-lake-table" for a name that is not a lake table
// of the writer; kFailedPrecondition "lake-table-missing" if T does not exist (run `oml init`).
Result<RebuildStart> StartRebuild(db::Conn& conn, const OutboxStream& s, const std::string& lake_root,
                                  const std::string& table);

}  // namespace oml::lake
