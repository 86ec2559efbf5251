-- 0001: the commit point (D1). Applied by `oml migrate` / `oml dev` inside one transaction,
-- as the migration admin with `SET ROLE oml_owner`, so oml_owner owns every object.
-- The application role oml_app gets only what the write/read paths need.
-- docs/data/postgres-schema.md describes every column.

SET LOCAL search_path = oml, pg_catalog;

-- The reserved provider tenant. Its chain carries deployment-level acts.
CREATE FUNCTION provider_tenant() RETURNS uuid LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT '00000000-0000-0000-0000-000000000000'::uuid $$;

-- The tenant a transaction is scoped to, from the per-transaction setting oml.tenant_id
-- (set with set_config('oml.tenant_id', $1, true)). NULL when unset: RLS then shows nothing.
CREATE FUNCTION current_tenant() RETURNS uuid LANGUAGE sql STABLE PARALLEL SAFE
  AS $$ SELECT nullif(current_setting('oml.tenant_id', true), '')::uuid $$;

CREATE TABLE tenants (
  tenant_id       uuid PRIMARY KEY,
  name            text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
  created_seq     bigint,          -- seq of tenant.created on the provider chain (NULL: provider)
  created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE chain_heads (
  tenant_id   uuid PRIMARY KEY REFERENCES tenants(tenant_id),
  seq         bigint NOT NULL CHECK (seq >= 1),
  event_hash  bytea  NOT NULL CHECK (length(event_hash) = 32),
  updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE journal (
  tenant_id     uuid   NOT NULL REFERENCES tenants(tenant_id),
  seq           bigint NOT NULL CHECK (seq >= 1),
  prev_hash     bytea  NOT NULL CHECK (length(prev_hash) = 32),
  event_hash    bytea  NOT NULL CHECK (length(event_hash) = 32),
  event_type    text   NOT NULL,
  key_id        text   NOT NULL,
  signed_bytes  bytea  NOT NULL,
  signature     bytea  NOT NULL,
  committed_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, seq)
);

-- Guard: the journal is append-only for every role, owner and superuser included.
CREATE FUNCTION journal_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'journal is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege', HINT = 'oml journal guard trigger';
END $$;
CREATE TRIGGER journal_guard_rows BEFORE UPDATE OR DELETE ON journal
  FOR EACH ROW EXECUTE FUNCTION journal_guard();
CREATE TRIGGER journal_guard_truncate BEFORE TRUNCATE ON journal
  FOR EACH STATEMENT EXECUTE FUNCTION journal_guard();

-- Signing keys journalled by key.issued on the provider chain (a fold of the provider chain).
CREATE TABLE signing_keys (
  key_id        text PRIMARY KEY,
  public_key    bytea NOT NULL CHECK (length(public_key) = 32),
  issued_seq    bigint NOT NULL,      -- provider-chain seq of its key.issued event
  issued_at     timestamptz NOT NULL, -- the key.issued event's time
  retired_at    timestamptz           -- time of the key.issued that replaced it
);

-- API keys: bearer tokens stored as SHA-256 only.
CREATE TABLE api_keys (
  key_hash     bytea PRIMARY KEY CHECK (length(key_hash) = 32),
  tenant_id    uuid NOT NULL REFERENCES tenants(tenant_id),
  principal    text NOT NULL,
  role         text NOT NULL CHECK (role IN ('writer', 'reviewer', 'admin')),
  created_at   timestamptz NOT NULL DEFAULT now(),
  revoked_at   timestamptz
);

-- Fold state: claims. One row per (artifact, version).
CREATE TABLE artifacts (
  tenant_id          uuid NOT NULL REFERENCES tenants(tenant_id),
  artifact_id        uuid NOT NULL,
  version            integer NOT NULL CHECK (version >= 1),
  workarea_id        text NOT NULL,
  path               text NOT NULL,
  principal          text NOT NULL,
  writer_key_id      text NOT NULL,
  provenance         text NOT NULL,
  simulation_id      text,
  media_type         text NOT NULL,
  size_bytes         bigint NOT NULL,
  plaintext_sha256   bytea NOT NULL CHECK (length(plaintext_sha256) = 32),
  ciphertext_sha256  bytea NOT NULL CHECK (length(ciphertext_sha256) = 32),
  state              text NOT NULL CHECK (state IN ('held', 'promoted', 'rejected', 'demoted', 'erased')),
  submitted_seq      bigint NOT NULL,
  erased_seq         bigint,
  created_at         timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, artifact_id, version)
);

-- Ciphertext of held bodies (quarantine in PostgreSQL for now; D3 moves large ones out).
CREATE TABLE artifact_bodies (
  tenant_id    uuid NOT NULL,
  artifact_id  uuid NOT NULL,
  version      integer NOT NULL,
  ciphertext   bytea NOT NULL,
  PRIMARY KEY (tenant_id, artifact_id, version),
  FOREIGN KEY (tenant_id, artifact_id, version) REFERENCES artifacts
);

-- Wrapped per-artifact DEKs. Erasure deletes the row (crypto-shredding); nothing else does.
CREATE TABLE artifact_keys (
  tenant_id    uuid NOT NULL REFERENCES tenants(tenant_id),
  artifact_id  uuid NOT NULL,
  kek_id       text NOT NULL,
  wrapped_dek  bytea NOT NULL,
  PRIMARY KEY (tenant_id, artifact_id)
);

-- Outbox → lake. seq comes from a CACHE 1 sequence drawn only inside enqueue_outbox(), after
-- the transaction has an xid (see ARCHITECTURE.md "The outbox cut").
CREATE SEQUENCE outbox_seq AS bigint CACHE 1;
CREATE TABLE outbox (
  seq            bigint PRIMARY KEY,
  tenant_id      uuid NOT NULL REFERENCES tenants(tenant_id),
  xid            xid8 NOT NULL,
  target_table   text NOT NULL,
  journal_seq    bigint NOT NULL,
  row_data       jsonb NOT NULL,
  enqueued_at    timestamptz NOT NULL DEFAULT now()
);

-- The only way outbox rows are written. pg_current_xact_id() is taken BEFORE the seq is
-- drawn: every transaction holding a seq <= L then has an xid below any xid assigned after L
-- was read, which is what makes the lake writer's horizon exact.
CREATE FUNCTION enqueue_outbox(p_tenant uuid, p_target text, p_journal_seq bigint, p_row jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  v_xid xid8 := pg_current_xact_id();
  v_seq bigint;
BEGIN
  v_seq := nextval('oml.outbox_seq');
  INSERT INTO oml.outbox (seq, tenant_id, xid, target_table, journal_seq, row_data)
  VALUES (v_seq, p_tenant, v_xid, p_target, p_journal_seq, p_row);
  RETURN v_seq;
END $$;

-- Write path, round trip 1: take the tenant's chain lock (held to commit) and read its head,
-- plus the signing key in force (NULL before the first key.issued), so a replica still holding
-- a rotated-out key stops signing at once. Returns (0, NULL, ..) for a tenant without a chain.
CREATE FUNCTION lock_head(p_tenant uuid, OUT head_seq bigint, OUT head_hash bytea, OUT key_in_force text)
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant::text, 0));
  SELECT h.seq, h.event_hash INTO head_seq, head_hash FROM oml.chain_heads h WHERE h.tenant_id = p_tenant;
  IF NOT FOUND THEN head_seq := 0; head_hash := NULL; END IF;
  SELECT k.key_id INTO key_in_force FROM oml.signing_keys k WHERE k.retired_at IS NULL
   ORDER BY k.issued_seq DESC LIMIT 1;
END $$;

-- Write path, round trip 2, last step: move the head from p_from to p_to (p_to > p_from; a
-- group commit appends several events at once) with the hash of event p_to.
-- REQUIRES: lock_head(p_tenant) earlier in this transaction. Raises serialization_failure if
-- the head is not at p_from (it cannot be while the lock is held; this is a tripwire).
CREATE FUNCTION advance_head(p_tenant uuid, p_from bigint, p_to bigint, p_hash bytea) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF p_to <= p_from THEN
    RAISE EXCEPTION 'head must move forward (% -> %)', p_from, p_to USING ERRCODE = 'data_exception';
  END IF;
  IF p_from = 0 THEN
    INSERT INTO oml.chain_heads (tenant_id, seq, event_hash) VALUES (p_tenant, p_to, p_hash);
    RETURN;
  END IF;
  UPDATE oml.chain_heads SET seq = p_to, event_hash = p_hash, updated_at = now()
   WHERE tenant_id = p_tenant AND seq = p_from;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'chain head of % is not at seq %', p_tenant, p_from USING ERRCODE = 'serialization_failure';
  END IF;
END $$;

-- Authentication happens before the tenant is known, so it bypasses RLS through this one
-- definer function, which reveals nothing but the key's own binding.
CREATE FUNCTION authenticate(p_hash bytea, OUT tenant_id uuid, OUT principal text, OUT role text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
  SELECT k.tenant_id, k.principal, k.role FROM oml.api_keys k
  WHERE k.key_hash = p_hash AND k.revoked_at IS NULL
$$;

-- Row-level security on every tenant-scoped table. The provider scope sees the tenant
-- registry (it creates tenants); nobody sees another tenant's chain or claims.
ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenants_scope ON tenants
  USING (tenant_id = current_tenant() OR current_tenant() = provider_tenant())
  WITH CHECK (tenant_id = current_tenant());
DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['chain_heads','journal','api_keys','artifacts','artifact_bodies',
                           'artifact_keys','outbox'] LOOP
    EXECUTE format('ALTER TABLE oml.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('CREATE POLICY %I ON oml.%I USING (tenant_id = oml.current_tenant()) '
                   'WITH CHECK (tenant_id = oml.current_tenant())', t || '_scope', t);
  END LOOP;
END $$;
-- signing_keys is deployment-wide public data (public keys); readable by all, written only in
-- the provider scope.
ALTER TABLE signing_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY signing_keys_read ON signing_keys FOR SELECT USING (true);
CREATE POLICY signing_keys_write ON signing_keys FOR INSERT WITH CHECK (current_tenant() = provider_tenant());
CREATE POLICY signing_keys_retire ON signing_keys FOR UPDATE USING (current_tenant() = provider_tenant());

-- Privileges of the application role.
GRANT USAGE ON SCHEMA oml TO oml_app;
GRANT SELECT, INSERT ON tenants, journal TO oml_app;
REVOKE UPDATE, DELETE, TRUNCATE ON journal FROM oml_app;
GRANT SELECT, INSERT, UPDATE ON chain_heads, signing_keys, artifacts TO oml_app;
GRANT SELECT, INSERT ON api_keys, artifact_bodies, outbox TO oml_app;
GRANT UPDATE (revoked_at) ON api_keys TO oml_app;
GRANT SELECT, INSERT, DELETE ON artifact_keys TO oml_app;
GRANT USAGE ON SEQUENCE outbox_seq TO oml_app;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA oml FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA oml TO oml_app;
