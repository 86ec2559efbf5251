-- 0012: recall and full-text search (issue 9, "Retrieval"). PostgreSQL only, never the lake.
-- admission/recall.h is the reader (GET /v1/claims, GET /v1/search) and the writer of claim_text;
-- docs/data/postgres-schema.md describes every object.
--
--   * Recall lists the newest version of each claim, newest submission first: keyset order
--     (submitted_seq DESC, artifact_id DESC). Every filter has an index whose columns end in that
--     order (tenant_id, <filter>, submitted_seq, artifact_id), so a page is one backward range
--     scan cut at the page size, whichever filter is given.
--   * The time filter is on the signed submission time. artifacts.submitted_at copies the envelope
--     time of claim.submitted (the journal row at submitted_seq), set on insert by a trigger. The
--     chain stamps times that never decrease with seq (journal.cc; `oml verify` requires it), so
--     "submitted after T" is exactly "submitted_seq above the last seq stamped at or before T":
--     the reader turns each time bound into a seq bound with one probe of artifacts_recall_time,
--     and the page stays a seq range scan of the filter's index.
--   * Search: claim_text holds a tsvector ('simple' configuration) of the text of each PROMOTED
--     claim version: its inline body, and later the extracted text of its attachments (one `part`
--     each), split into chunks of 65536 characters. Rows are inserted by a fold statement of
--     claim.promoted (admission::SearchTextFold) and deleted by the trigger below in the
--     transaction of any event whose fold moves the version out of 'promoted' (claim.demoted,
--     artifact.erased, and any later act). Invariant: a claim_text row exists only for a version
--     whose state is 'promoted'. Held, rejected, demoted and erased text is never indexed.
--     The lexemes are plaintext words: erasure deletes them in its own transaction (their dead
--     tuples leave the heap, the index and the WAL at the next VACUUM and WAL recycling).
--     A search reads claim_text through search_claim_text(), a definer function: under RLS the
--     planner could not use the GIN index (`@@` is not LEAKPROOF).

SET LOCAL search_path = oml, pg_catalog;

-- ---- Recall ----------------------------------------------------------------------------------

-- The envelope time of claim.submitted as signed (to the microsecond). NULL only for a row whose
-- claim.submitted is not in the journal (a row not written by oml: `oml verify --folds` reports
-- it); such a row is never matched by a time bound.
ALTER TABLE artifacts ADD COLUMN submitted_at timestamptz;

-- Sets submitted_at from the journal row at NEW.submitted_seq.
-- REQUIRES: the claim.submitted journal row is inserted before the fold's INSERT (it is: the
-- commit point inserts the journal row, then its fold statements).
CREATE FUNCTION artifacts_submitted_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.submitted_at := oml.event_time(NEW.tenant_id, NEW.submitted_seq)::timestamptz;
  RETURN NEW;
END $$;
CREATE TRIGGER artifacts_submitted_at BEFORE INSERT ON artifacts
  FOR EACH ROW EXECUTE FUNCTION artifacts_submitted_at();
UPDATE artifacts a SET submitted_at = event_time(a.tenant_id, a.submitted_seq)::timestamptz;

-- One index per filter, each ending in the keyset order.
CREATE INDEX artifacts_recall_all ON artifacts (tenant_id, submitted_seq, artifact_id);
CREATE INDEX artifacts_recall_workarea ON artifacts (tenant_id, workarea_id, submitted_seq, artifact_id);
CREATE INDEX artifacts_recall_state ON artifacts (tenant_id, state, submitted_seq, artifact_id);
CREATE INDEX artifacts_recall_provenance ON artifacts (tenant_id, provenance, submitted_seq, artifact_id);
CREATE INDEX artifacts_recall_simulation ON artifacts (tenant_id, simulation_id, submitted_seq, artifact_id)
  WHERE simulation_id IS NOT NULL;
-- A writer's own claims. Replaces 0007's artifacts_principal_submitted, its prefix (GET /v1/events
-- uses this one for the same range).
CREATE INDEX artifacts_recall_principal ON artifacts (tenant_id, principal, submitted_seq, artifact_id);
DROP INDEX artifacts_principal_submitted;
-- Time bound -> seq bound: the last row stamped at or before T (or the first at or after T).
CREATE INDEX artifacts_recall_time ON artifacts (tenant_id, submitted_at, submitted_seq);

-- ---- Search ----------------------------------------------------------------------------------

CREATE TABLE claim_text (
  tenant_id    uuid    NOT NULL REFERENCES tenants(tenant_id),
  artifact_id  uuid    NOT NULL,
  version      integer NOT NULL,
  -- Which text of the claim: 'body' (the inline body); the attachments' extracted text takes a
  -- part of its own (e.g. 'attachment:<upload_id>').
  part         text    NOT NULL CHECK (part ~ '^[a-z][a-z0-9:._-]{0,199}$'),
  chunk        integer NOT NULL CHECK (chunk >= 1),  -- 1-based; characters (chunk-1)*65536+1 ...
  tsv          tsvector NOT NULL,                     -- to_tsvector('pg_catalog.simple', chunk text)
  PRIMARY KEY (tenant_id, artifact_id, version, part, chunk),
  FOREIGN KEY (tenant_id, artifact_id, version) REFERENCES artifacts ON DELETE CASCADE
);
CREATE INDEX claim_text_tsv ON claim_text USING gin (tsv);

-- Deletes the text of a version that leaves 'promoted' (AFTER UPDATE OF state, so in the
-- transaction of the event whose fold moved it).
CREATE FUNCTION claim_text_retract() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM oml.claim_text t
   WHERE t.tenant_id = NEW.tenant_id AND t.artifact_id = NEW.artifact_id AND t.version = NEW.version;
  RETURN NULL;
END $$;
CREATE TRIGGER artifacts_claim_text_retract AFTER UPDATE OF state ON artifacts
  FOR EACH ROW WHEN (NEW.state <> 'promoted') EXECUTE FUNCTION claim_text_retract();

-- The matches of a search in the scoped tenant: (artifact_id, version, rank), rank = the best
-- ts_rank of the version's chunks for websearch_to_tsquery('simple', p_query). NULL scope: none.
-- A definer function, because under row-level security the planner may not use claim_text_tsv:
-- `@@` (ts_match_vq) is not LEAKPROOF, so it must not run before the policy's qual, and a search
-- as oml_app would read every tenant's rows. Running as the owner (not subject to RLS), it
-- filters by current_tenant() itself, which is exactly what claim_text_scope shows.
CREATE FUNCTION search_claim_text(p_query text)
RETURNS TABLE (artifact_id uuid, version integer, rank double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog ROWS 100 AS $$
  SELECT t.artifact_id, t.version, max(ts_rank(t.tsv, websearch_to_tsquery('pg_catalog.simple', p_query)))::float8
  FROM oml.claim_text t
  WHERE t.tenant_id = oml.current_tenant() AND t.tsv @@ websearch_to_tsquery('pg_catalog.simple', p_query)
  GROUP BY t.artifact_id, t.version
$$;
REVOKE EXECUTE ON FUNCTION search_claim_text(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION search_claim_text(text) TO oml_app;

ALTER TABLE claim_text ENABLE ROW LEVEL SECURITY;
CREATE POLICY claim_text_scope ON claim_text
  USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

GRANT SELECT, INSERT, DELETE ON claim_text TO oml_app;
REVOKE EXECUTE ON FUNCTION artifacts_submitted_at(), claim_text_retract() FROM PUBLIC;
