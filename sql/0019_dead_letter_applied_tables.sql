-- 0019: a requeue goes only to the tables that lack the row (issue 18, "A requeue puts old state
-- back, and can double bronze"). docs/data/postgres-schema.md and docs/data/delta-tables.md
-- describe both columns.
--
-- One outbox row feeds more than one table: a bronze/events row is appended to bronze and counted
-- in gold/daily_activity. A table later in a batch (gold) can refuse a row that an earlier one
-- (bronze) already committed; the row is then dead-lettered, and before this migration its requeue
-- appended it to bronze a second time (a third after a second dead letter and requeue).
--   dead_letter.applied_tables  the tables that held the row when it was dead-lettered (their
--                               Delta txn of the stream had passed its outbox seq), as the lake
--                               writer read them; also in the signed materialize-skipped payload.
--   outbox.skip_tables          set on a requeued row only: the tables it must not be applied to
--                               (the dead letter's applied_tables). NULL: every table of its target.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

ALTER TABLE dead_letter ADD COLUMN applied_tables text[] NOT NULL DEFAULT '{}';
ALTER TABLE outbox ADD COLUMN skip_tables text[];

DROP FUNCTION lake_dead_letter_commit(text, bigint, bigint, bigint, bytea, bytea, bytea, bytea, jsonb, text, integer);

-- As in 0010, plus: p_applied_tables is recorded in dead_letter.applied_tables, and must equal the
-- signed payload's applied_tables (so the signed event and the row never disagree).
CREATE FUNCTION lake_dead_letter_commit(p_stream text, p_epoch bigint, p_outbox_seq bigint,
                                        p_seq bigint, p_prev_hash bytea, p_event_hash bytea,
                                        p_signed_bytes bytea, p_signature bytea, p_bronze_row jsonb,
                                        p_error text, p_attempts integer, p_applied_tables text[])
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
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
  IF p_applied_tables IS NULL OR array_position(p_applied_tables, NULL) IS NOT NULL THEN
    RAISE EXCEPTION 'applied_tables must be an array of table names' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  v_env := pg_catalog.convert_from(p_signed_bytes, 'UTF8')::jsonb;
  SELECT * INTO v_head FROM oml.chain_heads h WHERE h.tenant_id = v_row.tenant_id;
  IF v_env->>'type' IS DISTINCT FROM 'materialize-skipped'
     OR v_env->>'tenant' IS DISTINCT FROM v_row.tenant_id::text
     OR (v_env->>'seq')::bigint IS DISTINCT FROM p_seq
     OR p_seq IS DISTINCT FROM v_head.seq + 1
     OR p_prev_hash IS DISTINCT FROM v_head.event_hash
     OR v_env->>'prev' IS DISTINCT FROM pg_catalog.encode(v_head.event_hash, 'hex')
     OR v_env->>'key_id' IS DISTINCT FROM v_key
     OR v_env->'payload'->>'stream' IS DISTINCT FROM p_stream
     OR (v_env->'payload'->>'outbox_seq')::bigint IS DISTINCT FROM p_outbox_seq
     OR v_env->'payload'->'applied_tables' IS DISTINCT FROM pg_catalog.to_jsonb(p_applied_tables)
     OR p_event_hash IS DISTINCT FROM pg_catalog.sha256(p_signed_bytes)
     OR p_bronze_row->>'event_hash' IS DISTINCT FROM pg_catalog.encode(p_event_hash, 'hex')
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
                               attempts, skipped_seq, applied_tables)
  VALUES (p_stream, p_outbox_seq, v_row.tenant_id, v_row.target_table, v_row.journal_seq, v_row.row_data,
          pg_catalog.left(p_error, 2000), p_attempts, p_seq, p_applied_tables)
  RETURNING id INTO v_id;
  RETURN v_id;
END $$;

-- As in 0010, plus: the new outbox row skips the tables that already hold the row (a dead letter
-- of a requeued row carries the tables its own row skipped: they hold it too).
CREATE OR REPLACE FUNCTION requeue_dead_letter(p_id bigint, p_seq bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
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
  IF pg_catalog.cardinality(v_dl.applied_tables) > 0 THEN
    UPDATE oml.outbox SET skip_tables = v_dl.applied_tables WHERE seq = v_new;
  END IF;
  UPDATE oml.dead_letter SET requeued_at = pg_catalog.now(), requeued_seq = p_seq, requeued_outbox_seq = v_new
   WHERE id = p_id;
  RETURN v_new;
END $$;

DROP FUNCTION list_dead_letters(text);
CREATE FUNCTION list_dead_letters(p_stream text)
RETURNS TABLE(id bigint, outbox_seq bigint, tenant_id uuid, target_table text, journal_seq bigint, error text,
              attempts integer, skipped_seq bigint, created_at timestamptz, requeued_at timestamptz,
              requeued_seq bigint, requeued_outbox_seq bigint, applied_tables text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
  SELECT d.id, d.outbox_seq, d.tenant_id, d.target_table, d.journal_seq, d.error, d.attempts, d.skipped_seq,
         d.created_at, d.requeued_at, d.requeued_seq, d.requeued_outbox_seq, d.applied_tables
    FROM oml.dead_letter d WHERE d.stream = p_stream ORDER BY d.id
$$;

REVOKE EXECUTE ON FUNCTION
  lake_dead_letter_commit(text, bigint, bigint, bigint, bytea, bytea, bytea, bytea, jsonb, text, integer, text[]),
  list_dead_letters(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
  lake_dead_letter_commit(text, bigint, bigint, bigint, bytea, bytea, bytea, bytea, jsonb, text, integer, text[])
  TO oml_lakewriter;
GRANT EXECUTE ON FUNCTION list_dead_letters(text) TO oml_app;
