-- 0009: review acts (issue 8, "Promotion"; issue 9 extends them). A reviewer's verdict journals
-- claim.promoted (accept) or claim.rejected (reject) on a held claim; a promoted claim can be
-- demoted (claim.demoted). admission/claims.h (Review) is the writer; docs/data/event-catalog.md
-- gives the events.
--
--   * artifacts gains the seq of each review event (promoted_seq, rejected_seq, demoted_seq). The
--     fold sets the state and the act's seq in one UPDATE guarded by the state the act starts
--     from, so of two racing acts on one claim exactly one is journalled.
--   * Promotion, demotion and erasure of a promoted (or demoted) claim enqueue, in the same
--     commit-point transaction, one outbox row per version for the Delta table silver/claims
--     (enqueue_silver_claims below). Nothing else does: a held or rejected claim never reaches
--     the outbox's silver stream, and no row carries a body (only where its ciphertext lives).
-- docs/data/postgres-schema.md describes every object.

SET LOCAL search_path = oml, pg_catalog;

ALTER TABLE artifacts
  ADD COLUMN promoted_seq bigint CHECK (promoted_seq >= 1),  -- claim.promoted; kept after demotion/erasure
  ADD COLUMN rejected_seq bigint CHECK (rejected_seq >= 1),  -- claim.rejected
  ADD COLUMN demoted_seq  bigint CHECK (demoted_seq >= 1),   -- claim.demoted
  -- A claim is accepted or rejected, not both, and only a promoted one is demoted. The state is
  -- not tied to the seqs here: a row changed by hand (state 'promoted' without a claim.promoted)
  -- is what `oml verify --folds` reports, and enqueue_silver_claims refuses to build a silver row
  -- for a version without promoted_seq.
  ADD CONSTRAINT artifacts_review_seqs CHECK (
        (promoted_seq IS NULL OR rejected_seq IS NULL)
    AND (demoted_seq IS NULL OR promoted_seq IS NOT NULL));

-- The envelope time of the event at (p_tenant, p_seq): `YYYY-MM-DDTHH:MM:SS.ffffffZ`, exactly as
-- signed. NULL if the tenant's chain (as RLS shows it) has no such event.
CREATE FUNCTION event_time(p_tenant uuid, p_seq bigint) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT convert_from(j.signed_bytes, 'UTF8')::jsonb ->> 'time' FROM oml.journal j
  WHERE j.tenant_id = p_tenant AND j.seq = p_seq
$$;

-- The silver/claims row (outbox row_data) of one version of a claim, as the artifacts row stands
-- now, for the event at p_seq. Exactly these keys (the lake writer's contract):
--   tenant_id, artifact_id (uuid text), version, workarea_id, path (at write), writer_key_id,
--   principal (the author), submitted_at (time of claim.submitted at submitted_seq), promoted_at
--   (time of claim.promoted at promoted_seq), provenance, simulation_id (null if none),
--   plaintext_sha256, ciphertext_sha256 (lowercase hex), media_type, size_bytes,
--   body_location ('postgres:oml.artifact_bodies': where the ciphertext lives), state,
--   state_changed_at (time of the event at p_seq), last_event_seq (p_seq).
-- NULL if there is no such row.
CREATE FUNCTION silver_claim_row(p_tenant uuid, p_artifact uuid, p_version integer, p_seq bigint)
RETURNS jsonb LANGUAGE sql STABLE AS $$
  SELECT jsonb_build_object(
    'tenant_id', a.tenant_id::text, 'artifact_id', a.artifact_id::text, 'version', a.version,
    'workarea_id', a.workarea_id, 'path', a.path, 'writer_key_id', a.writer_key_id, 'principal', a.principal,
    'submitted_at', oml.event_time(a.tenant_id, a.submitted_seq),
    'promoted_at', oml.event_time(a.tenant_id, a.promoted_seq),
    'provenance', a.provenance, 'simulation_id', a.simulation_id,
    'plaintext_sha256', encode(a.plaintext_sha256, 'hex'), 'ciphertext_sha256', encode(a.ciphertext_sha256, 'hex'),
    'media_type', a.media_type, 'size_bytes', a.size_bytes,
    'body_location', 'postgres:oml.artifact_bodies',
    'state', a.state, 'state_changed_at', oml.event_time(a.tenant_id, p_seq), 'last_event_seq', p_seq)
  FROM oml.artifacts a
  WHERE a.tenant_id = p_tenant AND a.artifact_id = p_artifact AND a.version = p_version
$$;

-- Enqueues (enqueue_outbox, target 'silver/claims', journal_seq p_seq) the silver row of every
-- version of p_artifact that was ever promoted (promoted_seq set), or of version p_version only
-- when it is not NULL, in version order. Returns how many rows it enqueued.
-- REQUIRES: runs in the commit-point transaction of the event at p_seq, after that event's
-- journal insert and after the fold's UPDATE of the artifacts rows (the row carries the new state).
-- Tripwires (SQLSTATE P0001, the transaction fails): a row whose state is not promoted, demoted or
-- erased, or whose submitted_at, promoted_at or state_changed_at is not in the journal; a
-- p_version that is not exactly one ever-promoted version.
CREATE FUNCTION enqueue_silver_claims(p_tenant uuid, p_artifact uuid, p_version integer, p_seq bigint)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  r record;
  v_row jsonb;
  n integer := 0;
BEGIN
  FOR r IN SELECT a.version FROM oml.artifacts a
           WHERE a.tenant_id = p_tenant AND a.artifact_id = p_artifact AND a.promoted_seq IS NOT NULL
             AND (p_version IS NULL OR a.version = p_version)
           ORDER BY a.version LOOP
    v_row := oml.silver_claim_row(p_tenant, p_artifact, r.version, p_seq);
    IF v_row ->> 'state' NOT IN ('promoted', 'demoted', 'erased') OR v_row ->> 'submitted_at' IS NULL
       OR v_row ->> 'promoted_at' IS NULL OR v_row ->> 'state_changed_at' IS NULL THEN
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

REVOKE EXECUTE ON FUNCTION event_time(uuid, bigint), silver_claim_row(uuid, uuid, integer, bigint),
  enqueue_silver_claims(uuid, uuid, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION event_time(uuid, bigint), silver_claim_row(uuid, uuid, integer, bigint),
  enqueue_silver_claims(uuid, uuid, integer, bigint) TO oml_app;
