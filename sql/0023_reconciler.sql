-- 0023: the reconciler's role (issue 20). `oml reconcile` is a key-less auditor: it connects as
-- oml_reconciler (LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE, created by db::Migrate's
-- roles block like oml_lakewriter) and compares what PostgreSQL says with the lake and the object
-- store. It may:
--   * read every tenant's signed journal, chain heads and tenant registry, and the public signing
--     keys, so it can check a chain without being able to append to one;
--   * read every tenant's outbox rows and the outbox sequence's last value (SELECT on outbox_seq:
--     pg_sequence_last_value, never nextval), the frontier, each table's recorded txn version
--     (lake_table_txn) and the dead letters;
--   * read the claims' and attachments' metadata (artifacts, attachments, simulations,
--     review_served, review_progress) and the held bodies (artifact_bodies: location, object key
--     and ciphertext; a ciphertext without its key is opaque);
--   * read the upload sessions through the view upload_sessions_audit only, which leaves out every
--     column that holds key material or sealed state (wrapped_dek, kek_id, stream_sealed,
--     plaintext_sha_sealed, ciphertext_sha_state, nonce_prefix) and the client's words (filename,
--     upload_metadata, declared digests, the creating key);
-- and nothing else. It holds no privilege at all on a table that holds a wrapped key
-- (artifact_keys, attachment_keys, upload_sessions) or text derived from a plaintext or a
-- credential (claim_text, api_keys, idempotency_keys, idempotency_fence): holding its credentials
-- and the KEK together still opens no body. It writes nothing: no INSERT, UPDATE, DELETE or
-- TRUNCATE anywhere, no sequence draw, no function but current_tenant(), which the tables'
-- per-tenant policies call.
--
-- Row-level security. Every table it reads is under RLS for everyone else; a policy of its own
-- (`<table>_reconciler_read`, SELECT, TO oml_reconciler, true) shows it every tenant's rows with
-- no tenant scope set. Policies OR: every other role keeps exactly the view it had.
--
-- The view. upload_sessions_audit is owned by oml_owner, like every object here, and a view reads
-- its tables with its owner's rights (security_invoker is off): oml_owner owns upload_sessions,
-- whose RLS is ENABLEd but not FORCEd, so the view shows every tenant's sessions. FORCE ROW LEVEL
-- SECURITY on upload_sessions would empty it (src/db/reconciler_role_pg_test.cc asserts both).
-- docs/data/postgres-schema.md describes every object.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

CREATE VIEW upload_sessions_audit AS
  SELECT tenant_id, upload_id, state, upload_length, upload_offset, ciphertext_offset, part_count, parts_left,
         created_at, updated_at, expires_at, completed_at, ciphertext_sha256, ciphertext_size, object_key
  FROM upload_sessions;

DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'chain_heads', 'journal', 'signing_keys', 'outbox', 'lake_frontier',
                           'lake_table_txn', 'dead_letter', 'artifacts', 'artifact_bodies', 'attachments',
                           'simulations', 'review_served', 'review_progress'] LOOP
    -- A table without RLS would show the role every row through its grant alone; all of these
    -- have it, and a policy on a table without it would be a promise nobody keeps.
    IF NOT (SELECT c.relrowsecurity FROM pg_class c WHERE c.oid = format('oml.%I', t)::regclass) THEN
      RAISE EXCEPTION 'oml.% has no row-level security', t USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    EXECUTE format('CREATE POLICY %I ON oml.%I FOR SELECT TO oml_reconciler USING (true)',
                   t || '_reconciler_read', t);
    EXECUTE format('GRANT SELECT ON oml.%I TO oml_reconciler', t);
  END LOOP;
END $$;

-- Privileges of the reconciler: exactly these, and the SELECTs of the loop above.
GRANT USAGE ON SCHEMA oml TO oml_reconciler;
GRANT SELECT ON SEQUENCE outbox_seq TO oml_reconciler;  -- pg_sequence_last_value: L, not nextval
GRANT SELECT ON upload_sessions_audit TO oml_reconciler;
-- The per-tenant policies (*_scope) apply to every role, so evaluating them calls current_tenant();
-- tenants_scope also calls provider_tenant() (a constant).
GRANT EXECUTE ON FUNCTION current_tenant(), provider_tenant() TO oml_reconciler;
