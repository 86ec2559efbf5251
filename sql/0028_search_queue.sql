-- 0028: the search index is built after a promotion commits, not inside its transaction
-- (issue 22, "Accept of 3 x 8 MiB text attachments"): PostgreSQL's to_tsvector over the body
-- and the attachments' extracted text took 2.4 s of an accept of 24 MiB of text. The fold of
-- claim.promoted now only queues the version here; the indexer of `oml serve`
-- (admission::Claims::IndexSearchQueue) extracts the text and inserts the claim_text rows in a
-- transaction of its own that first locks the artifact row (FOR SHARE) and checks it is still
-- promoted, so a demotion, rejection or erasure that commits first leaves nothing indexed, and
-- one that comes later waits for the lock and then removes the rows (claim_text_retract).
--   promoted_seq  the claim.promoted event's seq (the queue is worked in that order)
--   attempts      failed attempts so far (the text could not be read: kek-unavailable, a
--                 missing object); not_before delays the next one (backoff), last_error says why
-- A row leaves the queue when its version is indexed, or found no longer promoted (or gone).

SET LOCAL search_path = oml, pg_catalog, pg_temp;

CREATE TABLE search_queue (
  tenant_id     uuid        NOT NULL REFERENCES tenants(tenant_id),
  artifact_id   uuid        NOT NULL,
  version       integer     NOT NULL,
  promoted_seq  bigint      NOT NULL,
  attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  not_before    timestamptz NOT NULL DEFAULT now(),
  last_error    text        CHECK (octet_length(last_error) <= 2000),
  PRIMARY KEY (tenant_id, artifact_id, version),
  FOREIGN KEY (tenant_id, artifact_id, version) REFERENCES artifacts ON DELETE CASCADE
);
CREATE INDEX search_queue_order ON search_queue (tenant_id, promoted_seq);

ALTER TABLE search_queue ENABLE ROW LEVEL SECURITY;
CREATE POLICY search_queue_scope ON search_queue
  USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
GRANT SELECT, INSERT, UPDATE, DELETE ON search_queue TO oml_app;

-- The tenants with queued versions due now. Reveals tenant ids only; the indexer then works in
-- each tenant's scope (as upload_sweep_tenants, 0011).
CREATE FUNCTION search_queue_tenants() RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
  SELECT DISTINCT q.tenant_id FROM oml.search_queue q WHERE q.not_before <= now()
$$;
REVOKE EXECUTE ON FUNCTION search_queue_tenants() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION search_queue_tenants() TO oml_app;
