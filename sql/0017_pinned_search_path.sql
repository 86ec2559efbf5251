-- 0017: no role runs its own code as the schema owner (issue 17). docs/data/postgres-schema.md,
-- "Threat model of the database roles", states what each role may and may never do.
--
-- The hole: every SECURITY DEFINER function pinned `search_path = oml, pg_catalog`. When pg_temp
-- is not named in a path, PostgreSQL searches the session's temporary schema FIRST for relation
-- and type names (CVE-2018-1058; the manual's "Writing SECURITY DEFINER Functions Safely"). Any
-- role with TEMP on the database (PUBLIC has it by default) could create `pg_temp.xid8` with an
-- assignment cast whose function then ran as oml_owner inside enqueue_outbox_json: it granted
-- itself UPDATE/DELETE/TRUNCATE on the journal and disabled the guard trigger.
--
-- The rule from here on, checked from the catalog by tests/test_db_boundary.py:
--   * every function in schema oml either pins `search_path = oml, pg_catalog, pg_temp` (pg_temp
--     named, and last: it can then shadow nothing that exists in oml or pg_catalog), or has a
--     SQL-standard body (`RETURN ...` / `BEGIN ATOMIC`), which is parsed once, at creation, and
--     so binds its names then, whatever the caller's path is later. Trigger functions and the
--     non-definer helpers are pinned too: a PL/pgSQL function resolves its variable types when a
--     session first compiles it, and a trigger fired inside a definer function runs as the owner;
--   * every function is owned by oml_owner, which cannot log in;
--   * TEMP on the database is revoked from PUBLIC by `oml migrate` (src/db/migrate.cc; a database
--     privilege, which the migration's owner role may not change). No oml role needs it.
-- Applied migrations are never edited; this one redefines what it qualifies and pins the rest.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

-- The two functions every row-level security policy calls: SQL-standard bodies, so they stay
-- inlinable into the policies' quals (a function with a SET clause is never inlined) and are
-- immune to the caller's path.
CREATE OR REPLACE FUNCTION provider_tenant() RETURNS pg_catalog.uuid LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN '00000000-0000-0000-0000-000000000000'::pg_catalog.uuid;
CREATE OR REPLACE FUNCTION current_tenant() RETURNS pg_catalog.uuid LANGUAGE sql STABLE PARALLEL SAFE
  RETURN NULLIF(pg_catalog.current_setting('oml.tenant_id', true), '')::pg_catalog.uuid;

-- The outbox's only writers, fully qualified (0016's bodies otherwise).
CREATE OR REPLACE FUNCTION enqueue_outbox_json(p_tenant uuid, p_target text, p_journal_seq bigint, p_row json)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
DECLARE
  v_xid pg_catalog.xid8 := pg_catalog.pg_current_xact_id();
  v_seq pg_catalog.int8;
BEGIN
  IF p_tenant IS DISTINCT FROM oml.current_tenant() THEN
    RAISE EXCEPTION 'outbox rows are enqueued in their own tenant''s scope' USING ERRCODE = 'insufficient_privilege';
  END IF;
  v_seq := pg_catalog.nextval('oml.outbox_seq'::pg_catalog.regclass);
  INSERT INTO oml.outbox (seq, tenant_id, xid, target_table, journal_seq, row_data)
  VALUES (v_seq, p_tenant, v_xid, p_target, p_journal_seq, p_row);
  RETURN v_seq;
END $$;

CREATE OR REPLACE FUNCTION enqueue_outbox(p_tenant uuid, p_target text, p_journal_seq bigint, p_row jsonb)
RETURNS bigint LANGUAGE sql SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
  SELECT oml.enqueue_outbox_json(p_tenant, p_target, p_journal_seq, p_row::pg_catalog.json)
$$;

-- 0012's search, with its cast qualified.
CREATE OR REPLACE FUNCTION search_claim_text(p_query text)
RETURNS TABLE (artifact_id uuid, version integer, rank double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp ROWS 100 AS $$
  SELECT t.artifact_id, t.version,
         pg_catalog.max(pg_catalog.ts_rank(t.tsv, pg_catalog.websearch_to_tsquery('pg_catalog.simple', p_query)))::pg_catalog.float8
  FROM oml.claim_text t
  WHERE t.tenant_id = oml.current_tenant()
    AND t.tsv OPERATOR(pg_catalog.@@) pg_catalog.websearch_to_tsquery('pg_catalog.simple', p_query)
  GROUP BY t.artifact_id, t.version
$$;

-- 0015's retention sweep, with its cast qualified.
CREATE OR REPLACE FUNCTION rejected_retention_due(p_retention interval) RETURNS TABLE (tenant_id uuid, artifact_id uuid)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
  SELECT a.tenant_id, a.artifact_id FROM oml.artifacts a
  WHERE a.state = 'rejected' AND a.erased_seq IS NULL AND a.rejected_seq IS NOT NULL
    AND a.version = (SELECT pg_catalog.max(v.version) FROM oml.artifacts v
                     WHERE v.tenant_id = a.tenant_id AND v.artifact_id = a.artifact_id)
    AND oml.event_time(a.tenant_id, a.rejected_seq)::pg_catalog.timestamptz <= pg_catalog.now() - p_retention
  ORDER BY a.tenant_id, a.rejected_seq
$$;

-- Every other function keeps its body and gets the pinned path.
ALTER FUNCTION authenticate(bytea) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION begin_key_rotation() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION lake_dead_letter_check(text, bigint, bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION lake_dead_letter_begin(text, bigint, bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION lake_dead_letter_commit(text, bigint, bigint, bigint, bytea, bytea, bytea, bytea, jsonb, text, integer)
  SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION requeue_dead_letter(bigint, bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION list_dead_letters(text) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION dead_letter_tenant(bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION upload_sweep_tenants(interval) SET search_path = oml, pg_catalog, pg_temp;
-- Trigger functions (the guards among them: a shadowed type must not bend a guard's comparison).
ALTER FUNCTION journal_guard() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION signing_keys_guard() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION api_keys_not_provider() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION lake_frontier_guard() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION artifacts_submitted_at() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION claim_text_retract() SET search_path = oml, pg_catalog, pg_temp;
-- Helpers that run as their caller, also inside the definer functions above.
ALTER FUNCTION require_live_api_key(bytea) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION key_in_force() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION rotation_lock_key() SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION lock_head(uuid, bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION advance_head(uuid, bigint, bigint, bytea, text) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION event_time(uuid, bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION silver_claim_row(uuid, uuid, integer, bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION enqueue_silver_claims(uuid, uuid, integer, bigint) SET search_path = oml, pg_catalog, pg_temp;
ALTER FUNCTION end_simulation(uuid, text, bigint) SET search_path = oml, pg_catalog, pg_temp;
