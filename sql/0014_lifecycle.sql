-- 0014_lifecycle: the later acts of the admission lifecycle (issue 9, "Admission lifecycle"):
-- reassignment of a claim to another workarea, and simulations. admission/lifecycle.h is the
-- writer; docs/data/event-catalog.md gives the events, docs/data/postgres-schema.md every object.
--
--   * claim.reassigned sets artifacts.workarea_id of every version (the stable key) and
--     reassigned_seq; path (the path at write) is history and never changes. Its fold UPDATE is
--     guarded by the workarea the claim was found in, so of two racing acts one is journalled.
--   * simulations: one row per simulation a tenant ever started (ids are never reused).
--     simulation.started inserts it running; simulation.ended (end_simulation below) ends it and
--     RETRACTS its claims: every version of the simulation that is not erased gets state
--     'retracted' and retracted_seq, and the ever-promoted ones a silver/claims retract, all in
--     the event's transaction. claim.submitted under a simulation is guarded by the simulation
--     being running (admission::SimulationRunningGuard), under the same chain lock, so a claim
--     is never left un-retracted in an ended simulation.
--   * silver/claims rows: provenance is the provenance CLASS, 'simulation' for a claim made under
--     a simulation (the author's declared provenance stays in artifacts and in claim.submitted);
--     state_changed_at is the time of the event that set the state (a reassignment changes
--     workarea_id, not the state); 'retracted' is a silver state. enqueue_silver_claims applies
--     both on top of silver_claim_row, which later migrations may redefine.

SET LOCAL search_path = oml, pg_catalog;

CREATE TABLE simulations (
  tenant_id      uuid   NOT NULL REFERENCES tenants(tenant_id),
  simulation_id  text   NOT NULL,  -- fields.h CheckSimulationId: 1..200 characters, no control characters
  description    text   NOT NULL DEFAULT '',
  state          text   NOT NULL CHECK (state IN ('running', 'ended')),
  started_seq    bigint NOT NULL CHECK (started_seq >= 1),  -- simulation.started
  ended_seq      bigint CHECK (ended_seq >= 1),             -- simulation.ended
  PRIMARY KEY (tenant_id, simulation_id),
  CONSTRAINT simulations_ended CHECK ((state = 'ended') = (ended_seq IS NOT NULL) AND
                                      (ended_seq IS NULL OR ended_seq > started_seq))
);

ALTER TABLE simulations ENABLE ROW LEVEL SECURITY;
CREATE POLICY simulations_scope ON simulations
  USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
GRANT SELECT, INSERT ON simulations TO oml_app;
GRANT UPDATE (state, ended_seq) ON simulations TO oml_app;

ALTER TABLE artifacts
  DROP CONSTRAINT artifacts_state_check,
  ADD CONSTRAINT artifacts_state_check
    CHECK (state IN ('held', 'promoted', 'rejected', 'demoted', 'erased', 'retracted')),
  ADD COLUMN retracted_seq  bigint CHECK (retracted_seq >= 1),   -- the simulation.ended that retracted it
  ADD COLUMN reassigned_seq bigint CHECK (reassigned_seq >= 1),  -- the last claim.reassigned
  -- Only a claim made under a simulation is ever retracted.
  ADD CONSTRAINT artifacts_retracted_simulated CHECK (retracted_seq IS NULL OR simulation_id IS NOT NULL);

-- Ends simulation p_simulation of p_tenant for the simulation.ended at p_seq and retracts its
-- claims: every version with that simulation_id and erased_seq NULL gets state 'retracted' and
-- retracted_seq = p_seq (whatever its state: held, promoted, rejected or demoted), then every
-- such version that was ever promoted enqueues its silver/claims row (state 'retracted'), in
-- (submitted_seq, artifact_id, version) order. Returns how many versions it retracted.
-- Raises division_by_zero (SQLSTATE 22012, db::kZeroRowsGuard, as the guarded UPDATEs) if the
-- simulation is not running: a racing end, or one never started, journals nothing.
-- REQUIRES: runs in the commit-point transaction of the event at p_seq, after its journal insert.
CREATE FUNCTION end_simulation(p_tenant uuid, p_simulation text, p_seq bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  r record;
  n integer;
BEGIN
  UPDATE oml.simulations SET state = 'ended', ended_seq = p_seq
   WHERE tenant_id = p_tenant AND simulation_id = p_simulation AND state = 'running';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'simulation is not running (seq %)', p_seq USING ERRCODE = 'division_by_zero';
  END IF;
  UPDATE oml.artifacts SET state = 'retracted', retracted_seq = p_seq
   WHERE tenant_id = p_tenant AND simulation_id = p_simulation AND erased_seq IS NULL;
  GET DIAGNOSTICS n = ROW_COUNT;
  FOR r IN SELECT a.artifact_id, a.version FROM oml.artifacts a
           WHERE a.tenant_id = p_tenant AND a.simulation_id = p_simulation AND a.retracted_seq = p_seq
             AND a.promoted_seq IS NOT NULL
           ORDER BY a.submitted_seq, a.artifact_id, a.version LOOP
    PERFORM oml.enqueue_silver_claims(p_tenant, r.artifact_id, r.version, p_seq);
  END LOOP;
  RETURN n;
END $$;

-- As 0009's, with the silver row's provenance class, state_changed_at and the 'retracted' state
-- (above). The row is silver_claim_row's, overlaid with:
--   provenance         'simulation' if simulation_id is set, else as silver_claim_row has it;
--   state_changed_at   envelope time of the event that set the state (promoted_seq, demoted_seq,
--                      erased_seq or retracted_seq, by state): p_seq's for every act but a
--                      reassignment, which sets only workarea_id.
-- Tripwires as 0009's, with 'retracted' a silver state.
CREATE OR REPLACE FUNCTION enqueue_silver_claims(p_tenant uuid, p_artifact uuid, p_version integer, p_seq bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  r record;
  v_row jsonb;
  n integer := 0;
BEGIN
  FOR r IN SELECT a.version, a.simulation_id,
                  CASE a.state WHEN 'promoted' THEN a.promoted_seq WHEN 'demoted' THEN a.demoted_seq
                               WHEN 'erased' THEN a.erased_seq WHEN 'retracted' THEN a.retracted_seq END AS state_seq
           FROM oml.artifacts a
           WHERE a.tenant_id = p_tenant AND a.artifact_id = p_artifact AND a.promoted_seq IS NOT NULL
             AND (p_version IS NULL OR a.version = p_version)
           ORDER BY a.version LOOP
    v_row := oml.silver_claim_row(p_tenant, p_artifact, r.version, p_seq)
             || jsonb_build_object('state_changed_at', oml.event_time(p_tenant, r.state_seq));
    IF r.simulation_id IS NOT NULL THEN
      v_row := v_row || jsonb_build_object('provenance', 'simulation');
    END IF;
    IF v_row IS NULL OR v_row ->> 'state' NOT IN ('promoted', 'demoted', 'erased', 'retracted')
       OR v_row ->> 'submitted_at' IS NULL OR v_row ->> 'promoted_at' IS NULL OR v_row ->> 'state_changed_at' IS NULL THEN
      RAISE EXCEPTION 'silver row of % v% at seq % is incomplete or not promoted: %', p_artifact, r.version, p_seq, v_row;
    END IF;
    PERFORM oml.enqueue_outbox(p_tenant, 'silver/claims', p_seq, v_row);
    n := n + 1;
  END LOOP;
  IF p_version IS NOT NULL AND n <> 1 THEN
    RAISE EXCEPTION 'version % of % was never promoted (seq %)', p_version, p_artifact, p_seq;
  END IF;
  RETURN n;
END $$;

REVOKE EXECUTE ON FUNCTION end_simulation(uuid, text, bigint), enqueue_silver_claims(uuid, uuid, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION end_simulation(uuid, text, bigint), enqueue_silver_claims(uuid, uuid, integer, bigint) TO oml_app;
