-- 0010: dead letters of the lake writer (issue 8, "Dead letters"), journalled on the row's tenant
-- chain. docs/data/postgres-schema.md and docs/data/event-catalog.md describe every object.
--
-- A poison outbox row (one the writer cannot materialize after its retry budget: an unknown target
-- table, row_data that does not fit the table) is moved aside in ONE transaction that
--   1. journals a signed `materialize-skipped` event on the row's tenant chain, and its bronze row;
--   2. inserts the dead_letter row (the outbox row's data kept whole);
-- after which the frontier may pass the row. The lake writer signs the event itself (the same
-- signing key as the server: it must be the key in force) but holds no privilege on the journal:
-- two SECURITY DEFINER functions do the writes, and refuse anything but that one event type, on
-- that row's tenant, under the caller's lease:
--   lake_dead_letter_begin   locks the chain exactly as lock_head does and returns its head;
--   lake_dead_letter_commit  checks the signed event and writes journal, outbox, head, dead_letter.
-- `oml dead-letter requeue ID` re-enqueues through a signed `materialize-requeued` event whose fold
-- calls requeue_dead_letter (granted to oml_app): never a table edit.

SET LOCAL search_path = oml, pg_catalog;

ALTER TABLE dead_letter ADD COLUMN requeued_seq bigint CHECK (requeued_seq >= 1);        -- materialize-requeued's chain seq
ALTER TABLE dead_letter ADD COLUMN requeued_outbox_seq bigint CHECK (requeued_outbox_seq >= 1);  -- the new outbox row

-- The dead-lettering caller holds the stream's lease at p_epoch, and the row is one it may skip:
-- in the stream, above the frontier, not dead-lettered yet. Returns the outbox row.
CREATE FUNCTION lake_dead_letter_check(p_stream text, p_epoch bigint, p_outbox_seq bigint)
RETURNS outbox LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
DECLARE
  v_front oml.lake_frontier;
  v_row oml.outbox;
BEGIN
  SELECT * INTO v_front FROM oml.lake_frontier WHERE stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'unknown outbox stream %', p_stream USING ERRCODE = 'no_data_found';
  END IF;
  IF v_front.lease_epoch IS DISTINCT FROM p_epoch THEN
    RAISE EXCEPTION 'the lake writer lease of stream % is at epoch %, not %', p_stream, v_front.lease_epoch, p_epoch
      USING ERRCODE = 'insufficient_privilege', HINT = 'oml lease-lost';
  END IF;
  IF p_outbox_seq <= v_front.frontier_seq THEN
    RAISE EXCEPTION 'outbox seq % is at or below the frontier % of stream %', p_outbox_seq, v_front.frontier_seq, p_stream
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- One stream today: the outbox table is the "default" stream's (lake/outbox_cut.h).
  SELECT * INTO v_row FROM oml.outbox WHERE seq = p_outbox_seq;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no outbox row at seq %', p_outbox_seq USING ERRCODE = 'no_data_found';
  END IF;
  IF EXISTS (SELECT 1 FROM oml.dead_letter d WHERE d.stream = p_stream AND d.outbox_seq = p_outbox_seq) THEN
    RAISE EXCEPTION 'outbox seq % is dead-lettered already', p_outbox_seq USING ERRCODE = 'unique_violation';
  END IF;
  RETURN v_row;
END $$;

-- Step 1, inside the caller's transaction: lease and row checks, then the row's tenant chain is
-- locked like an append's (rotation lock shared, chain lock; both to commit), and its head, head
-- time and the key in force are returned. The transaction's tenant scope is set to that tenant.
CREATE FUNCTION lake_dead_letter_begin(p_stream text, p_epoch bigint, p_outbox_seq bigint,
                                       OUT tenant_id uuid, OUT head_seq bigint, OUT head_hash bytea,
                                       OUT head_time text, OUT key_in_force text, OUT target_table text,
                                       OUT journal_seq bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
DECLARE
  v_row oml.outbox;
  v_head record;
BEGIN
  v_row := oml.lake_dead_letter_check(p_stream, p_epoch, p_outbox_seq);
  PERFORM set_config('oml.tenant_id', v_row.tenant_id::text, true);
  SELECT * INTO v_head FROM oml.lock_head(v_row.tenant_id, 0);
  tenant_id := v_row.tenant_id;
  head_seq := v_head.head_seq;
  head_hash := v_head.head_hash;
  head_time := v_head.head_time;
  key_in_force := v_head.key_in_force;
  target_table := v_row.target_table;
  journal_seq := v_row.journal_seq;
END $$;

-- Step 2, same transaction: the signed materialize-skipped event for p_outbox_seq, and the
-- dead_letter row. Checks (any failure raises and the caller rolls back): the lease and row
-- checks again; signed_bytes is a JSON envelope of type materialize-skipped for this tenant at
-- head_seq + 1 over the head hash, signed by the key in force, whose payload names this stream
-- and outbox seq; event_hash = SHA-256(signed_bytes); the bronze row names the same event. The
-- Ed25519 signature itself is checked by `oml verify` (PostgreSQL has no Ed25519). Returns the
-- dead_letter id.
CREATE FUNCTION lake_dead_letter_commit(p_stream text, p_epoch bigint, p_outbox_seq bigint,
                                        p_seq bigint, p_prev_hash bytea, p_event_hash bytea,
                                        p_signed_bytes bytea, p_signature bytea, p_bronze_row jsonb,
                                        p_error text, p_attempts integer)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
DECLARE
  v_row oml.outbox;
  v_env jsonb;
  v_head oml.chain_heads;
  v_key text := oml.key_in_force();
  v_id bigint;
BEGIN
  v_row := oml.lake_dead_letter_check(p_stream, p_epoch, p_outbox_seq);
  IF oml.current_tenant() IS DISTINCT FROM v_row.tenant_id THEN
    RAISE EXCEPTION 'lake_dead_letter_begin was not called for this row in this transaction'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  v_env := convert_from(p_signed_bytes, 'UTF8')::jsonb;
  SELECT * INTO v_head FROM oml.chain_heads h WHERE h.tenant_id = v_row.tenant_id;
  IF v_env->>'type' IS DISTINCT FROM 'materialize-skipped'
     OR v_env->>'tenant' IS DISTINCT FROM v_row.tenant_id::text
     OR (v_env->>'seq')::bigint IS DISTINCT FROM p_seq
     OR p_seq IS DISTINCT FROM v_head.seq + 1
     OR p_prev_hash IS DISTINCT FROM v_head.event_hash
     OR v_env->>'prev' IS DISTINCT FROM encode(v_head.event_hash, 'hex')
     OR v_env->>'key_id' IS DISTINCT FROM v_key
     OR v_env->'payload'->>'stream' IS DISTINCT FROM p_stream
     OR (v_env->'payload'->>'outbox_seq')::bigint IS DISTINCT FROM p_outbox_seq
     OR p_event_hash IS DISTINCT FROM sha256(p_signed_bytes)
     OR p_bronze_row->>'event_hash' IS DISTINCT FROM encode(p_event_hash, 'hex')
     OR (p_bronze_row->>'seq')::bigint IS DISTINCT FROM p_seq
     OR p_bronze_row->>'tenant_id' IS DISTINCT FROM v_row.tenant_id::text THEN
    RAISE EXCEPTION 'not a materialize-skipped event for outbox seq % at the head of its chain', p_outbox_seq
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  INSERT INTO oml.journal (tenant_id, seq, prev_hash, event_hash, event_type, key_id, signed_bytes, signature)
  VALUES (v_row.tenant_id, p_seq, p_prev_hash, p_event_hash, 'materialize-skipped', v_key, p_signed_bytes, p_signature);
  PERFORM oml.enqueue_outbox(v_row.tenant_id, 'bronze/events', p_seq, p_bronze_row);
  PERFORM oml.advance_head(v_row.tenant_id, v_head.seq, p_seq, p_event_hash, v_env->>'time');
  INSERT INTO oml.dead_letter (stream, outbox_seq, tenant_id, target_table, journal_seq, payload_ref, error,
                               attempts, skipped_seq)
  VALUES (p_stream, p_outbox_seq, v_row.tenant_id, v_row.target_table, v_row.journal_seq, v_row.row_data,
          left(p_error, 2000), p_attempts, p_seq)
  RETURNING id INTO v_id;
  RETURN v_id;
END $$;

-- The fold of materialize-requeued (an operator's `oml dead-letter requeue ID`), run in the
-- event's own transaction in its tenant scope: marks the dead letter requeued by event p_seq and
-- enqueues its row again under a new outbox seq (the same target table, journal seq and
-- row_data). Once only: a dead letter already requeued raises. Returns the new outbox seq.
CREATE FUNCTION requeue_dead_letter(p_id bigint, p_seq bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
DECLARE
  v_dl oml.dead_letter;
  v_new bigint;
BEGIN
  SELECT * INTO v_dl FROM oml.dead_letter WHERE id = p_id FOR UPDATE;
  IF NOT FOUND OR v_dl.tenant_id IS DISTINCT FROM oml.current_tenant() THEN
    RAISE EXCEPTION 'no dead letter % in this tenant', p_id USING ERRCODE = 'no_data_found';
  END IF;
  IF v_dl.requeued_at IS NOT NULL THEN
    RAISE EXCEPTION 'dead letter % was requeued already (seq %)', p_id, v_dl.requeued_seq
      USING ERRCODE = 'unique_violation';
  END IF;
  v_new := oml.enqueue_outbox(v_dl.tenant_id, v_dl.target_table, v_dl.journal_seq, v_dl.payload_ref);
  UPDATE oml.dead_letter SET requeued_at = now(), requeued_seq = p_seq, requeued_outbox_seq = v_new WHERE id = p_id;
  RETURN v_new;
END $$;

-- Dead letters as an operator reads them (`oml dead-letter list`), through the application role
-- (which has no privilege on dead_letter itself): every column but the row data.
CREATE FUNCTION list_dead_letters(p_stream text)
RETURNS TABLE(id bigint, outbox_seq bigint, tenant_id uuid, target_table text, journal_seq bigint, error text,
              attempts integer, skipped_seq bigint, created_at timestamptz, requeued_at timestamptz,
              requeued_seq bigint, requeued_outbox_seq bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
  SELECT d.id, d.outbox_seq, d.tenant_id, d.target_table, d.journal_seq, d.error, d.attempts, d.skipped_seq,
         d.created_at, d.requeued_at, d.requeued_seq, d.requeued_outbox_seq
    FROM oml.dead_letter d WHERE d.stream = p_stream ORDER BY d.id
$$;

-- The tenant of a dead letter (the requeue event goes on that chain); NULL if there is none.
CREATE FUNCTION dead_letter_tenant(p_id bigint) RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
  SELECT d.tenant_id FROM oml.dead_letter d WHERE d.id = p_id
$$;

REVOKE EXECUTE ON FUNCTION lake_dead_letter_check(text, bigint, bigint),
  lake_dead_letter_begin(text, bigint, bigint),
  lake_dead_letter_commit(text, bigint, bigint, bigint, bytea, bytea, bytea, bytea, jsonb, text, integer),
  requeue_dead_letter(bigint, bigint), list_dead_letters(text), dead_letter_tenant(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lake_dead_letter_begin(text, bigint, bigint),
  lake_dead_letter_commit(text, bigint, bigint, bigint, bytea, bytea, bytea, bytea, jsonb, text, integer)
  TO oml_lakewriter;
GRANT EXECUTE ON FUNCTION requeue_dead_letter(bigint, bigint), list_dead_letters(text), dead_letter_tenant(bigint)
  TO oml_app;
-- The writer reads dead_letter only (which seqs to leave out of a batch); the dead-letter rows
-- are written by lake_dead_letter_commit, and requeued_at by requeue_dead_letter.
REVOKE INSERT, UPDATE ON dead_letter FROM oml_lakewriter;
