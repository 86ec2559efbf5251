-- 0015_body_objects: where an inline body's ciphertext lives, and the retention of rejected claims (issue 9: "keep small ones there and
-- move large ones to quarantine, one rule for both"). admission/claims.h states the rule:
--
--   a body whose ciphertext is at most inline_body_max_bytes (default 64 KiB) stays in
--   artifact_bodies.ciphertext (location 'postgres'); a larger one is an object named by its
--   ciphertext digest, <tenant>/<ciphertext_sha256 hex>, in the quarantine bucket while held or
--   rejected, copied byte for byte to the bodies bucket on promotion, deleted after erasure, the
--   same lifecycle as an attachment's object (admission/attachments.h).
--
-- The journal never changes: the signed digests are the same wherever the bytes are.

SET LOCAL search_path = oml, pg_catalog;

ALTER TABLE artifact_bodies
  ALTER COLUMN ciphertext DROP NOT NULL,
  ADD COLUMN location text NOT NULL DEFAULT 'postgres'
    CHECK (location IN ('postgres', 'quarantine', 'bodies', 'none')),
  ADD COLUMN object_key text,
  -- Bytes in exactly one place: in the row, or in an object (none once erased and deleted).
  ADD CONSTRAINT artifact_bodies_one_place CHECK (
    (location = 'postgres' AND ciphertext IS NOT NULL AND object_key IS NULL) OR
    (location IN ('quarantine', 'bodies', 'none') AND ciphertext IS NULL AND object_key IS NOT NULL));

GRANT UPDATE (location) ON artifact_bodies TO oml_app;

-- silver/claims' body_location now says where the ciphertext lives: 'postgres:oml.artifact_bodies'
-- for a row-held body, 'bodies:<object_key>' for an object in the bodies bucket (promoted).
CREATE OR REPLACE FUNCTION silver_claim_row(p_tenant uuid, p_artifact uuid, p_version integer, p_seq bigint)
RETURNS jsonb LANGUAGE sql STABLE AS $$
  SELECT jsonb_build_object(
    'tenant_id', a.tenant_id::text, 'artifact_id', a.artifact_id::text, 'version', a.version,
    'workarea_id', a.workarea_id, 'path', a.path, 'writer_key_id', a.writer_key_id, 'principal', a.principal,
    'submitted_at', oml.event_time(a.tenant_id, a.submitted_seq),
    'promoted_at', oml.event_time(a.tenant_id, a.promoted_seq),
    'provenance', a.provenance, 'simulation_id', a.simulation_id,
    'plaintext_sha256', encode(a.plaintext_sha256, 'hex'), 'ciphertext_sha256', encode(a.ciphertext_sha256, 'hex'),
    'media_type', a.media_type, 'size_bytes', a.size_bytes,
    'body_location', CASE WHEN b.location IS NULL OR b.location = 'postgres' THEN 'postgres:oml.artifact_bodies'
                          ELSE b.location || ':' || b.object_key END,
    'state', a.state, 'state_changed_at', oml.event_time(a.tenant_id, p_seq), 'last_event_seq', p_seq)
  FROM oml.artifacts a
  LEFT JOIN oml.artifact_bodies b USING (tenant_id, artifact_id, version)
  WHERE a.tenant_id = p_tenant AND a.artifact_id = p_artifact AND a.version = p_version
$$;

REVOKE EXECUTE ON FUNCTION silver_claim_row(uuid, uuid, integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION silver_claim_row(uuid, uuid, integer, bigint) TO oml_app;

-- Rejected claims whose retention ended (issue 9: a rejected claim's bodies "stay in quarantine
-- until its retention ends, then [are] removed (journalled)"): every claim whose newest version
-- is rejected, not erased, and whose claim.rejected is older than p_retention, across tenants.
-- admission/retention.h erases each (artifact.erased by principal oml-retention) in its tenant's
-- scope. SECURITY DEFINER (the owner is not subject to RLS); it reveals ids only.
CREATE FUNCTION rejected_retention_due(p_retention interval) RETURNS TABLE (tenant_id uuid, artifact_id uuid)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
  SELECT a.tenant_id, a.artifact_id FROM oml.artifacts a
  WHERE a.state = 'rejected' AND a.erased_seq IS NULL AND a.rejected_seq IS NOT NULL
    AND a.version = (SELECT max(v.version) FROM oml.artifacts v
                     WHERE v.tenant_id = a.tenant_id AND v.artifact_id = a.artifact_id)
    AND oml.event_time(a.tenant_id, a.rejected_seq)::timestamptz <= now() - p_retention
  ORDER BY a.tenant_id, a.rejected_seq
$$;
REVOKE EXECUTE ON FUNCTION rejected_retention_due(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION rejected_retention_due(interval) TO oml_app;

-- How much of an item a reviewer was served by Range reads (admission/attachments.h): the prefix
-- [0, served_upto) read without a gap. A file counts as served (review.served) when a whole read
-- serves it, or when this prefix reaches its size: one byte per file never counts as a review.
CREATE TABLE review_progress (
  tenant_id    uuid     NOT NULL,
  artifact_id  uuid     NOT NULL,
  version      integer  NOT NULL,
  item         smallint NOT NULL CHECK (item BETWEEN 1 AND 64),
  reviewer     text     NOT NULL,
  served_upto  bigint   NOT NULL CHECK (served_upto >= 0),
  PRIMARY KEY (tenant_id, artifact_id, version, item, reviewer),
  FOREIGN KEY (tenant_id, artifact_id, version) REFERENCES artifacts
);
ALTER TABLE review_progress ENABLE ROW LEVEL SECURITY;
CREATE POLICY review_progress_scope ON review_progress USING (tenant_id = current_tenant())
  WITH CHECK (tenant_id = current_tenant());
GRANT SELECT, INSERT, UPDATE ON review_progress TO oml_app;

-- review.served's fold points its row at the latest serve event (a row not written by a serve
-- is replaced by the next real one: admission/attachments.h RecordServed).
GRANT UPDATE (served_seq) ON review_served TO oml_app;
