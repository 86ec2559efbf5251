#include "admission/lifecycle.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "fields/fields.h"
#include "common/sync_point.h"

namespace oml::admission {
namespace {

// The own-work rule of Claims::Fetch (claims.cc HiddenFrom): a claim that is not promoted exists
// only for its author, reviewers and admins.
bool Hidden(const ClaimMeta& m, const Caller& c) {
  return m.state != "promoted" && m.principal != c.principal && c.role != "reviewer" && c.role != "admin";
}

bool Governs(const Caller& c) { return c.role == "reviewer" || c.role == "admin"; }

Status Erased(const std::string& id, int64_t seq) {
  return Status(Code::kGone, "claim " + id + " was erased at seq " + std::to_string(seq), "erased");
}

Status NoSimulation() { return NotFound("no simulation with this id in the tenant", "simulation-not-found"); }

// The simulation's row as (state, ended_seq); nullopt if it was never started. No sync point.
Result<std::optional<std::pair<std::string, int64_t>>> StateOf(db::Pool& pool, const std::string& tenant,
                                                               const std::string& simulation_id) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool.Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r,
                       conn->Scoped(tenant, {"SELECT state, coalesce(ended_seq, 0) FROM oml.simulations "
                                             "WHERE tenant_id = $1 AND simulation_id = $2",
                                             {db::Text(tenant), db::Text(simulation_id)},
                                             "oml_simulation_state"}));
  if (r.size() == 0) return std::optional<std::pair<std::string, int64_t>>();
  return std::optional<std::pair<std::string, int64_t>>(std::make_pair(r.Get(0, 0), r.GetInt(0, 1)));
}

// OK iff running; the 409 otherwise. Never quotes the id (fields.h: messages never quote values).
Status RunningOrRefusal(const std::optional<std::pair<std::string, int64_t>>& st) {
  if (!st)
    return FailedPrecondition("the claim names a simulation that was never started in this tenant", "simulation-not-running");
  if (st->first != "running")
    return FailedPrecondition("the claim names a simulation that ended at seq " + std::to_string(st->second),
                              "simulation-not-running");
  return Status::Ok();
}

// Enqueues the silver/claims rows of every version that was ever promoted (sql/0009, 0014).
const char* kEnqueueSilver = "SELECT oml.enqueue_silver_claims($1, $2, $3, $4)";

}  // namespace

Status CheckSimulationRunning(db::Pool& pool, const std::string& tenant, const std::string& simulation_id) {
  OML_ASSIGN_OR_RETURN(auto st, StateOf(pool, tenant, simulation_id));
  OML_RETURN_IF_ERROR(RunningOrRefusal(st));
  // Test hook: an end of the simulation committing from here on meets the fold's guard.
  return OML_SYNC_POINT("claims.submit.after_simulation_check");
}

db::Stmt SimulationRunningGuard(const std::string& tenant, const std::string& simulation_id) {
  // Under the tenant's chain lock (journal.h), so simulation.ended's fold is wholly before or
  // wholly after this statement.
  return {"SELECT 1/count(*) FROM oml.simulations WHERE tenant_id = $1 AND simulation_id = $2 AND state = 'running'",
          {db::Text(tenant), db::Text(simulation_id)},
          "oml_simulation_running_guard"};
}

Status SimulationRefusal(db::Pool& pool, const std::string& tenant, const std::optional<std::string>& simulation,
                         const Status& failed) {
  if (!simulation || failed.type() != db::kZeroRowsGuard) return Status::Ok();
  auto st = StateOf(pool, tenant, *simulation);
  if (!st.ok()) return Status::Ok();  // report the original failure
  return RunningOrRefusal(*st);
}

// ---- Reassignment ---------------------------------------------------------------------------

Result<std::pair<ClaimMeta, journal::Receipt>> Lifecycle::Reassign(const Caller& c, const std::string& artifact_id,
                                                                   const std::string& workarea_id,
                                                                   const std::string& reason) {
  OML_RETURN_IF_ERROR(fields::CheckReason(reason));
  OML_RETURN_IF_ERROR(fields::CheckWorkareaId(workarea_id));
  if (!Claims::ValidUuid(artifact_id)) return NotFound("no claim " + artifact_id, "claim-not-found");
  // The refusal of a reassignment of a claim found as `m`; OK if it may go ahead.
  auto refusal = [&](const ClaimMeta& m) -> Status {
    if (Hidden(m, c)) return NotFound("no claim " + artifact_id, "claim-not-found");
    if (m.erased_seq) return Erased(artifact_id, *m.erased_seq);
    if (!Governs(c) && !(m.principal == c.principal && m.state == "held"))
      return PermissionDenied("only reviewers, admins and the author of a held claim may reassign it", "forbidden-role");
    if (m.workarea_id == workarea_id)
      return FailedPrecondition("claim " + artifact_id + " is already in that workarea", "workarea-unchanged");
    return Status::Ok();
  };
  OML_ASSIGN_OR_RETURN(ClaimMeta meta, claims_->LoadNewest(c, artifact_id));
  OML_RETURN_IF_ERROR(refusal(meta));
  // The versions in the claim's workarea (all of them: a claim has one workarea). Read apart
  // from `meta`: the fold's guard catches any change in between.
  std::vector<int64_t> versions;
  {
    OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
    OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(c.tenant_id, {"SELECT version FROM oml.artifacts WHERE tenant_id = $1 "
                                                                "AND artifact_id = $2 AND workarea_id = $3 ORDER BY version",
                                                                {db::Text(c.tenant_id), db::Text(artifact_id),
                                                                 db::Text(meta.workarea_id)},
                                                                "oml_reassign_versions"}));
    for (int i = 0; i < r.size(); ++i) versions.push_back(r.GetInt(i, 0));
  }
  if (versions.empty())
    return Status(Code::kAborted, "claim " + artifact_id + " changed concurrently; retry", "transaction-conflict");
  std::string array = "{";
  for (size_t i = 0; i < versions.size(); ++i) array += (i ? "," : "") + std::to_string(versions[i]);
  array += "}";

  nlohmann::json payload = {{"artifact_id", artifact_id},
                            {"versions", versions},
                            {"from_workarea_id", meta.workarea_id},
                            {"to_workarea_id", workarea_id},
                            {"reason", reason}};
  journal::EventSpec ev{"claim.reassigned", c.principal, std::move(payload)};
  const std::string tenant = c.tenant_id, from = meta.workarea_id;
  const int64_t n = static_cast<int64_t>(versions.size());
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    // Guarded by the workarea the claim was found in and by erasure: every listed version must
    // still be there, else 1/0 and the transaction leaves nothing.
    return {{"WITH u AS (UPDATE oml.artifacts SET workarea_id = $3, reassigned_seq = $4 WHERE tenant_id = $1 "
             "AND artifact_id = $2 AND version = ANY($5::integer[]) AND workarea_id = $6 AND erased_seq IS NULL "
             "RETURNING 1) SELECT 1/(count(*) = $7)::int FROM u",
             {db::Text(tenant), db::Text(artifact_id), db::Text(workarea_id), db::Int(seq), db::Text(array),
              db::Text(from), db::Int(n)},
             "oml_reassign"},
            // Ever-promoted versions: their silver/claims row now carries the new workarea_id.
            {kEnqueueSilver, {db::Text(tenant), db::Text(artifact_id), db::Null(), db::Int(seq)},
             "oml_lifecycle_silver_enqueue"}};
  };
  ev.api_key_hash = c.api_key_hash;  // refused (401) if the key was revoked meanwhile
  auto rc = journal_->Append(c.tenant_id, ev);
  if (!rc.ok()) {
    if (rc.status().type() != db::kZeroRowsGuard) return rc.status();
    // Lost a race: answer as the reassignment that came second would have been answered.
    OML_ASSIGN_OR_RETURN(ClaimMeta now, claims_->LoadNewest(c, artifact_id));
    if (Status s = refusal(now); !s.ok()) return s;
    return Status(Code::kAborted, "claim " + artifact_id + " changed concurrently; retry", "transaction-conflict");
  }
  meta.workarea_id = workarea_id;
  return std::make_pair(meta, *rc);
}

// ---- Simulations ----------------------------------------------------------------------------

Result<std::optional<Simulation>> Lifecycle::LoadSimulation(const std::string& tenant, const std::string& simulation_id) {
  OML_ASSIGN_OR_RETURN(db::Pool::Handle conn, pool_->Acquire());
  OML_ASSIGN_OR_RETURN(db::Rows r, conn->Scoped(tenant, {"SELECT simulation_id, description, state, started_seq, ended_seq "
                                                         "FROM oml.simulations WHERE tenant_id = $1 AND simulation_id = $2",
                                                         {db::Text(tenant), db::Text(simulation_id)},
                                                         "oml_simulation_load"}));
  if (r.size() == 0) return std::optional<Simulation>();
  Simulation s;
  s.simulation_id = r.Get(0, 0);
  s.description = r.Get(0, 1);
  s.state = r.Get(0, 2);
  s.started_seq = r.GetInt(0, 3);
  if (!r.IsNull(0, 4)) s.ended_seq = r.GetInt(0, 4);
  return std::optional<Simulation>(std::move(s));
}

Result<std::pair<Simulation, journal::Receipt>> Lifecycle::StartSimulation(const Caller& c,
                                                                           const std::string& simulation_id,
                                                                           const std::string& description) {
  OML_RETURN_IF_ERROR(fields::CheckSimulationId(simulation_id));
  OML_RETURN_IF_ERROR(fields::CheckDescription(description));
  if (!Governs(c)) return PermissionDenied("role " + c.role + " may not start simulations", "forbidden-role");
  auto exists = [](const Simulation& s) {
    return FailedPrecondition("this simulation id was started at seq " + std::to_string(s.started_seq) +
                                  "; simulation ids are never reused",
                              "simulation-exists");
  };
  OML_ASSIGN_OR_RETURN(auto found, LoadSimulation(c.tenant_id, simulation_id));
  if (found) return exists(*found);

  journal::EventSpec ev{"simulation.started", c.principal,
                        nlohmann::json{{"simulation_id", simulation_id}, {"description", description}}};
  const std::string tenant = c.tenant_id;
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    // A racing start of the same id inserts nothing here: 1/0, and its transaction leaves nothing.
    return {{"WITH i AS (INSERT INTO oml.simulations (tenant_id, simulation_id, description, state, started_seq) "
             "VALUES ($1, $2, $3, 'running', $4) ON CONFLICT DO NOTHING RETURNING 1) SELECT 1/count(*) FROM i",
             {db::Text(tenant), db::Text(simulation_id), db::Text(description), db::Int(seq)},
             "oml_simulation_start"}};
  };
  ev.api_key_hash = c.api_key_hash;
  auto rc = journal_->Append(c.tenant_id, ev);
  if (!rc.ok()) {
    if (rc.status().type() != db::kZeroRowsGuard) return rc.status();
    OML_ASSIGN_OR_RETURN(auto now, LoadSimulation(c.tenant_id, simulation_id));
    if (now) return exists(*now);
    return Status(Code::kAborted, "the simulation changed concurrently; retry", "transaction-conflict");
  }
  Simulation s{simulation_id, description, "running", rc->seq, std::nullopt, std::nullopt};
  return std::make_pair(std::move(s), *rc);
}

Result<std::pair<Simulation, journal::Receipt>> Lifecycle::EndSimulation(const Caller& c, const std::string& simulation_id,
                                                                         const std::string& reason) {
  OML_RETURN_IF_ERROR(fields::CheckReason(reason));
  if (!Governs(c)) return PermissionDenied("role " + c.role + " may not end simulations", "forbidden-role");
  if (!fields::CheckSimulationId(simulation_id).ok()) return NoSimulation();
  auto refusal = [](const std::optional<Simulation>& s) -> Status {
    if (!s) return NoSimulation();
    if (s->state != "running")
      return FailedPrecondition("the simulation ended at seq " + std::to_string(s->ended_seq.value_or(0)),
                                "simulation-not-running");
    return Status::Ok();
  };
  OML_ASSIGN_OR_RETURN(auto found, LoadSimulation(c.tenant_id, simulation_id));
  OML_RETURN_IF_ERROR(refusal(found));

  journal::EventSpec ev{"simulation.ended", c.principal,
                        nlohmann::json{{"simulation_id", simulation_id}, {"reason", reason}}};
  const std::string tenant = c.tenant_id;
  ev.fold = [&](int64_t seq) -> std::vector<db::Stmt> {
    // sql/0014: ends it (guarded: 22012 unless running), retracts every claim of it that is not
    // erased and enqueues the silver retracts of the ever-promoted ones.
    return {{"SELECT oml.end_simulation($1, $2, $3)", {db::Text(tenant), db::Text(simulation_id), db::Int(seq)},
             "oml_simulation_end"}};
  };
  ev.api_key_hash = c.api_key_hash;
  // Test hook: a submission under the simulation committing from here on is retracted by this end.
  OML_RETURN_IF_ERROR(OML_SYNC_POINT("lifecycle.simulation_end.before_append"));
  auto rc = journal_->Append(c.tenant_id, ev);
  if (!rc.ok()) {
    if (rc.status().type() != db::kZeroRowsGuard) return rc.status();
    OML_ASSIGN_OR_RETURN(auto now, LoadSimulation(c.tenant_id, simulation_id));
    if (Status s = refusal(now); !s.ok()) return s;
    return Status(Code::kAborted, "the simulation changed concurrently; retry", "transaction-conflict");
  }
  Simulation s = *found;
  s.state = "ended";
  s.ended_seq = rc->seq;
  // What the fold retracted (retracted_seq is never set again: a claim is retracted once). Read
  // after the commit, best effort: the end is done whether or not this read succeeds.
  if (auto conn = pool_->Acquire(); conn.ok()) {
    auto n = (*conn)->Scoped(c.tenant_id, {"SELECT count(*) FROM oml.artifacts WHERE tenant_id = $1 AND retracted_seq = $2",
                                           {db::Text(c.tenant_id), db::Int(rc->seq)},
                                           "oml_simulation_retracted"});
    if (n.ok()) s.retracted = n->GetInt(0, 0);
  }
  return std::make_pair(std::move(s), *rc);
}

Result<Simulation> Lifecycle::GetSimulation(const Caller& c, const std::string& simulation_id) {
  if (!fields::CheckSimulationId(simulation_id).ok()) return NoSimulation();
  OML_ASSIGN_OR_RETURN(auto found, LoadSimulation(c.tenant_id, simulation_id));
  if (!found) return NoSimulation();
  return *found;
}

}  // namespace oml::admission
