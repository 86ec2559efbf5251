// `oml reconcile --repair`: what the audit (reconcile.h) found, put right the journal's way
// (seed: "when journal and lake disagree, the journal wins and the lake is repaired"; "repair is
// a journalled re-enqueue, never a manual table edit").
//
// Every repair is first journalled as a signed `lake.repair` event (docs/data/event-catalog.md),
// one per group of findings (tenant, class, table or bucket, action), naming the seqs or object
// keys; then done. The repair reads and copies ciphertext, never decrypts: it signs with the
// deployment's signing key and loads no KEK or DEK.
//
//   finding                                   action
//   ----------------------------------------  -------------------------------------------------
//   bronze/silver/gold row classes,           "rebuild": the table is emptied in one conditional
//   table-unreadable                          Delta commit and the lake writer refills it from the
//                                             outbox exactly once (lake/rebuild.h), once per table
//                                             however many findings name it
//   misplaced-object (containment-breach)     "delete" the bodies copy of a claim the journal never
//                                             promoted, once it can no longer be (rejected,
//                                             retracted, erased: a held one may be accepted
//                                             meanwhile, and is left) and quarantine holds the
//                                             signed bytes
//   misplaced-object (quarantine leftover)    "delete" the quarantine copy, once the bodies copy
//                                             hashes to the signed digest
//   erased-object-present, orphan-object,     "delete" (an orphan or a stale part only if no body,
//   stale-upload                              attachment or live upload session names it now)
//   missing-object, object-digest-mismatch    "copy" from the other bucket when its copy hashes to
//                                             the signed digest; else unrepairable (the bytes are
//                                             gone: only a backup holds them)
//   dead-lettered, stale-frontier,            none: a dead letter is requeued by the operator once
//   uncovered-outbox, journal-unreadable,     its cause is fixed (`oml dead-letter requeue`); a
//   an inline body's digest mismatch          stale or uncovered frontier is the lake writer's to
//                                             catch up; the journal and PostgreSQL are not repaired
//                                             from the lake
//
// Copies run before deletes. A repair that fails part way leaves its event journalled and the
// rest undone: running the audit again shows what is left.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blob/object_store.h"
#include "common/status.h"
#include "db/conn.h"
#include "journal/journal.h"
#include "reconcile/reconcile.h"

namespace oml::reconcile {

struct RepairDeps {
  journal::Journal* journal = nullptr;  // signs lake.repair (oml_app, the signing key)
  db::Conn* lakewriter = nullptr;       // table rebuilds (oml_lakewriter)
  db::Conn* reader = nullptr;           // re-reads a claim's state before a containment delete (oml_reconciler)
  blob::ObjectStore* quarantine = nullptr;
  blob::ObjectStore* bodies = nullptr;
  std::string lake_root;
  std::string stream = "default";
  std::string principal = "operator";
};

struct RepairAction {
  std::string tenant;  // the chain the event went to ("" = the provider's)
  std::string cls, table, action;  // action: rebuild | delete | copy
  std::vector<int64_t> seqs;
  std::vector<std::string> keys;
  int64_t event_seq = 0;  // the lake.repair event
  std::string outcome;    // "done", "rebuilding: refilled by the lake writer up to <F>", or why not
  bool ok = false;
};

struct RepairReport {
  std::string refused;  // why nothing was repaired (a chain the audit could not replay); "" otherwise
  std::vector<RepairAction> actions;
  std::vector<Finding> left;  // findings no repair applies to
  nlohmann::json ToJson() const;
  std::string ToText() const;
};

// Repairs what `audit` found. Nothing at all when the audit could not replay a chain
// (journal-unreadable: `refused` says so). A lake.repair event that cannot be journalled stops
// the groups after it (each recorded, ok = false, "not attempted"); other failures are recorded
// per action (ok = false).
Result<RepairReport> Repair(const Report& audit, const RepairDeps& d);

}  // namespace oml::reconcile
