// Later acts of the admission lifecycle (issue 9, "Admission lifecycle": reassignment and
// simulations; sql/0014_lifecycle.sql). Each act is one signed event whose fold is guarded, so of
// two racing acts exactly one is journalled, and whose silver/claims outbox rows (for versions
// that were ever promoted) are enqueued in the event's own transaction.
//
// Reassignment (claim.reassigned). Moves a claim, every version of it, to another workarea:
// workarea_id is the claim's stable key and changes; `path` (the path at write) is history and
// does not. Allowed for reviewers and admins on any claim that is not erased, and for the author
// of a HELD claim (a writer may file its own work elsewhere before it is reviewed, not after).
// Reassigning to the workarea the claim is already in is refused (409 workarea-unchanged): it
// would journal an event that changes nothing. The fold also re-enqueues the silver rows of the
// versions that were ever promoted, so the lake's silver/claims row carries the new workarea_id
// (its state, state_changed_at and path unchanged).
//
// Simulations (simulation.started, simulation.ended; table oml.simulations). A reviewer or an
// admin starts one under a tenant-unique id (never reused: a second start of the same id, running
// or ended, is 409 simulation-exists) and ends it. While it runs, claims may be submitted under
// it (claims.h SubmitRequest::simulation_id); a submission naming a simulation that is not
// running is refused with 409 simulation-not-running and writes nothing, checked before the
// claim is signed (CheckSimulationRunning) and again by the claim.submitted fold
// (SimulationRunningGuard). Claims made under a simulation carry its id for ever and their
// provenance CLASS is `simulation` (the author's declared provenance, signed in claim.submitted,
// is kept as is): the API's claim document says "provenance_class": "simulation" and the lake's
// silver/claims row has provenance "simulation" (sql/0014 enqueue_silver_claims).
// Ending a simulation retracts its claims: the fold of simulation.ended sets every claim version
// of the simulation that is not erased to state `retracted` (retracted_seq = its seq), whatever
// its state was, and enqueues the silver retract (state `retracted`) of every version that was
// ever promoted, all in that one transaction (oml.end_simulation).
//
// Races. Every event of a tenant is appended under its chain lock (journal.h), and every fold
// statement runs under it at READ COMMITTED, so a fold sees every event committed before it.
// A submission racing the end of its simulation therefore has exactly one outcome: either its
// claim.submitted committed first, and the end retracts the claim, or the end committed first,
// and the submission's guard refuses it (409 simulation-not-running, nothing written). A claim
// can never be left un-retracted in an ended simulation.
//
// Thread-safe; every call uses its own connections from the pool.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "admission/claims.h"
#include "common/status.h"
#include "db/conn.h"
#include "journal/journal.h"

namespace oml::admission {

struct Simulation {
  std::string simulation_id;
  std::string description;  // "" if none
  std::string state;        // running | ended
  int64_t started_seq = 0;  // its simulation.started
  std::optional<int64_t> ended_seq;
  // EndSimulation only: the claim versions its simulation.ended retracted, read after the
  // commit; nullopt if that read failed (the end itself committed).
  std::optional<int64_t> retracted;
};

// OK iff simulation `simulation_id` of `tenant` is running; kFailedPrecondition
// "simulation-not-running" (409) if it ended or was never started. Called by Claims::Submit
// before the claim is encrypted and signed.
Status CheckSimulationRunning(db::Pool& pool, const std::string& tenant, const std::string& simulation_id);

// The claim.submitted fold statement that re-checks it in the event's transaction: divides by
// zero (kZeroRowsGuard) unless the simulation is running.
db::Stmt SimulationRunningGuard(const std::string& tenant, const std::string& simulation_id);

// After a submission under `simulation` failed with `failed`: kFailedPrecondition
// "simulation-not-running" if `failed` is a guard failure and the simulation is not running (its
// guard refused the claim), else OK (the failure is someone else's to report).
Status SimulationRefusal(db::Pool& pool, const std::string& tenant, const std::optional<std::string>& simulation,
                         const Status& failed);

class Lifecycle {
 public:
  // REQUIRES: the pointers outlive this object.
  Lifecycle(journal::Journal* journal, db::Pool* pool, Claims* claims) : journal_(journal), pool_(pool), claims_(claims) {}

  // Reassigns every version of the claim to `workarea_id`; answers the newest version after it.
  // Checks, in order: kInvalidArgument "invalid-field" for a reason that breaks CheckReason or a
  // workarea_id that breaks CheckWorkareaId (fields.h); kNotFound "claim-not-found" for a
  // malformed, unknown, other tenant's or hidden id (the own-work rule of Fetch); kGone "erased";
  // kPermissionDenied "forbidden-role" unless the caller is a reviewer or an admin, or the author
  // of a held claim; kFailedPrecondition "workarea-unchanged" when the claim is already there.
  // Payload: artifact_id, versions (the versions moved, ascending), from_workarea_id,
  // to_workarea_id, reason ("" if none). The fold's UPDATE is guarded by the workarea the claim
  // was found in and by erasure: a reassignment that lost a race answers as if it came second
  // (410 erased, 409 workarea-unchanged) or kAborted "transaction-conflict" (503, retry).
  Result<std::pair<ClaimMeta, journal::Receipt>> Reassign(const Caller& c, const std::string& artifact_id,
                                                          const std::string& workarea_id, const std::string& reason);

  // Starts a simulation. Checks, in order: kInvalidArgument "invalid-field" for a simulation_id
  // that breaks CheckSimulationId or a description that breaks CheckDescription;
  // kPermissionDenied "forbidden-role" unless reviewer or admin; kFailedPrecondition
  // "simulation-exists" if the id was ever started (also when a racing start won).
  // Payload: simulation_id, description.
  Result<std::pair<Simulation, journal::Receipt>> StartSimulation(const Caller& c, const std::string& simulation_id,
                                                                  const std::string& description);
  // Ends a running simulation and retracts its claims (above). Checks, in order:
  // kInvalidArgument "invalid-field" for a reason that breaks CheckReason; kPermissionDenied
  // "forbidden-role" unless reviewer or admin; kNotFound "simulation-not-found";
  // kFailedPrecondition "simulation-not-running" if it already ended (also when a racing end won).
  // Payload: simulation_id, reason.
  Result<std::pair<Simulation, journal::Receipt>> EndSimulation(const Caller& c, const std::string& simulation_id,
                                                                const std::string& reason);
  // Any member of the tenant. kNotFound "simulation-not-found".
  Result<Simulation> GetSimulation(const Caller& c, const std::string& simulation_id);

 private:
  Result<std::optional<Simulation>> LoadSimulation(const std::string& tenant, const std::string& simulation_id);
  journal::Journal* journal_;
  db::Pool* pool_;
  Claims* claims_;
};

}  // namespace oml::admission
