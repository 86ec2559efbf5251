-- 0003: chain integrity (issue 6). Closes holes that a database superuser or a failover could
-- still slip through after 0001/0002:
--   * the outbox is written only through enqueue_outbox (SECURITY DEFINER, pinned search_path);
--     oml_app loses INSERT on outbox and USAGE on outbox_seq;
--   * "the signing key in force" has one definition, key_in_force(), used by lock_head and by
--     the server's startup check;
--   * a signing key is issued once: its row never changes key, and a retirement is never undone;
--   * rotation is exclusive with every append (a transaction-scoped advisory lock that appends
--     take shared), and begin_key_rotation() returns every chain's head at that moment, which the
--     key.issued payload records: a retired key is accepted by `oml verify` only up to those seqs;
--   * chain_heads keeps the signed time of the head event, so the writer can keep `time`
--     non-decreasing along a chain (verify requires it);
--   * lock_head also returns the hash of the event at a seq the server already knows (its highest
--     acknowledged or published head), so a server detects a rewound or diverged chain before it
--     signs onto it.
-- Nothing is released yet: these change formats in place (docs/data/* say so).
-- docs/data/postgres-schema.md describes every column and function.

SET LOCAL search_path = oml, pg_catalog;

-- The signed time of the head event ("YYYY-MM-DDTHH:MM:SS.ffffffZ"); NULL only for heads written
-- before 0003.
ALTER TABLE chain_heads ADD COLUMN event_time text;

-- The one definition of the signing key in force: the newest issued key that is not retired.
-- NULL before the first key.issued.
CREATE FUNCTION key_in_force() RETURNS text LANGUAGE sql STABLE AS $$
  SELECT k.key_id FROM oml.signing_keys k WHERE k.retired_at IS NULL ORDER BY k.issued_seq DESC LIMIT 1
$$;

-- Appends take this lock shared, rotation takes it exclusive (two-int4 key space, so it cannot
-- collide with the per-tenant bigint chain locks). 0x6f6d6c = 'oml'.
CREATE FUNCTION rotation_lock_key() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 7302508 $$;

-- Write path, round trip 1 (replaces 0001's): take the rotation lock shared and the tenant's
-- chain lock (both held to commit), read the head (seq, hash, signed time), the key in force,
-- and the hash of the stored event at p_known_seq (the server's highest acknowledged or
-- published seq for this tenant; 0 = none). Returns (0, NULL, NULL, ..) for a tenant without a
-- chain. The caller refuses to sign when head_seq < p_known_seq or known_hash differs from the
-- hash it acknowledged at p_known_seq: the chain was rewound or diverged under it.
DROP FUNCTION lock_head(uuid);
CREATE FUNCTION lock_head(p_tenant uuid, p_known_seq bigint DEFAULT 0,
                          OUT head_seq bigint, OUT head_hash bytea, OUT head_time text,
                          OUT key_in_force text, OUT known_hash bytea)
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(oml.rotation_lock_key(), 0);
  PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant::text, 0));
  SELECT h.seq, h.event_hash, h.event_time INTO head_seq, head_hash, head_time
    FROM oml.chain_heads h WHERE h.tenant_id = p_tenant;
  IF NOT FOUND THEN head_seq := 0; head_hash := NULL; head_time := NULL; END IF;
  key_in_force := oml.key_in_force();
  IF p_known_seq > 0 THEN
    SELECT j.event_hash INTO known_hash FROM oml.journal j WHERE j.tenant_id = p_tenant AND j.seq = p_known_seq;
  END IF;
END $$;

-- Write path, round trip 2, last step (replaces 0001's): also records the head event's time.
DROP FUNCTION advance_head(uuid, bigint, bigint, bytea);
CREATE FUNCTION advance_head(p_tenant uuid, p_from bigint, p_to bigint, p_hash bytea, p_time text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF p_to <= p_from THEN
    RAISE EXCEPTION 'head must move forward (% -> %)', p_from, p_to USING ERRCODE = 'data_exception';
  END IF;
  IF p_from = 0 THEN
    INSERT INTO oml.chain_heads (tenant_id, seq, event_hash, event_time) VALUES (p_tenant, p_to, p_hash, p_time);
    RETURN;
  END IF;
  UPDATE oml.chain_heads SET seq = p_to, event_hash = p_hash, event_time = p_time, updated_at = now()
   WHERE tenant_id = p_tenant AND seq = p_from;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'chain head of % is not at seq %', p_tenant, p_from USING ERRCODE = 'serialization_failure';
  END IF;
END $$;

-- Rotation, step 1: in the provider scope, take the rotation lock exclusive (waits for every
-- append in flight to commit; appends that start later wait for the rotation to commit and then
-- see the new key in force) and return every chain's head. The key.issued payload records these
-- heads under its signature: the retired key signed exactly the events up to them.
-- SECURITY DEFINER because chain_heads is scoped per tenant; it reveals seqs only, and only to
-- the provider scope.
CREATE FUNCTION begin_key_rotation(OUT tenant_id uuid, OUT seq bigint) RETURNS SETOF record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
BEGIN
  IF oml.current_tenant() IS DISTINCT FROM oml.provider_tenant() THEN
    RAISE EXCEPTION 'begin_key_rotation runs in the provider scope' USING ERRCODE = 'insufficient_privilege';
  END IF;
  PERFORM pg_advisory_xact_lock(oml.rotation_lock_key(), 0);
  RETURN QUERY SELECT h.tenant_id, h.seq FROM oml.chain_heads h ORDER BY h.tenant_id;
END $$;

-- A signing key is issued once. Its identity columns never change, and a retirement is final.
CREATE FUNCTION signing_keys_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.key_id <> OLD.key_id OR NEW.public_key <> OLD.public_key OR NEW.issued_seq <> OLD.issued_seq
     OR NEW.issued_at <> OLD.issued_at THEN
    RAISE EXCEPTION 'signing key % may not be changed', OLD.key_id
      USING ERRCODE = 'insufficient_privilege', HINT = 'oml signing_keys guard';
  END IF;
  IF OLD.retired_at IS NOT NULL AND NEW.retired_at IS DISTINCT FROM OLD.retired_at THEN
    RAISE EXCEPTION 'signing key % is retired; a retirement is final', OLD.key_id
      USING ERRCODE = 'insufficient_privilege', HINT = 'oml signing_keys guard';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER signing_keys_guard BEFORE UPDATE ON signing_keys
  FOR EACH ROW EXECUTE FUNCTION signing_keys_guard();
REVOKE UPDATE ON signing_keys FROM oml_app;
GRANT UPDATE (retired_at) ON signing_keys TO oml_app;

-- The outbox is written only through this function (replaces 0001's): SECURITY DEFINER with a
-- pinned search_path, and only for the transaction's own tenant. pg_current_xact_id() is still
-- taken BEFORE the seq is drawn (ARCHITECTURE.md "The outbox cut").
CREATE OR REPLACE FUNCTION enqueue_outbox(p_tenant uuid, p_target text, p_journal_seq bigint, p_row jsonb)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
DECLARE
  v_xid xid8 := pg_current_xact_id();
  v_seq bigint;
BEGIN
  IF p_tenant IS DISTINCT FROM oml.current_tenant() THEN
    RAISE EXCEPTION 'outbox rows are enqueued in their own tenant''s scope' USING ERRCODE = 'insufficient_privilege';
  END IF;
  v_seq := nextval('oml.outbox_seq');
  INSERT INTO oml.outbox (seq, tenant_id, xid, target_table, journal_seq, row_data)
  VALUES (v_seq, p_tenant, v_xid, p_target, p_journal_seq, p_row);
  RETURN v_seq;
END $$;
REVOKE INSERT ON outbox FROM oml_app;
REVOKE USAGE ON SEQUENCE outbox_seq FROM oml_app;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA oml FROM PUBLIC;
GRANT EXECUTE ON FUNCTION key_in_force(), rotation_lock_key(), lock_head(uuid, bigint), advance_head(uuid, bigint, bigint, bytea, text),
  begin_key_rotation(), enqueue_outbox(uuid, text, bigint, jsonb) TO oml_app;
REVOKE EXECUTE ON FUNCTION signing_keys_guard() FROM oml_app;
