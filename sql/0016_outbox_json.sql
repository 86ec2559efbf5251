-- 0016_outbox_json: outbox.row_data is json (the text as written, validated) instead of jsonb.
--
-- Why (docs/performance.md "Lake", "The outbox as json"): every outbox row is written once by the
-- commit point and read once, as text, by the lake writer; nothing in PostgreSQL queries inside
-- it. jsonb made both ends pay: jsonb_in builds the binary form on the commit path, and the
-- writer's cut prints it back to text (jsonb_out), ~2x the CPU of the json type on each side for
-- ~2 KB bronze rows. The lake writer reads any JSON text (blanks anywhere, escapes, keys in any
-- order); a key written twice is a row it refuses (a dead letter), and oml never writes one.
--
-- The commit point calls enqueue_outbox_json with the row text; enqueue_outbox(jsonb) stays for
-- the rows PostgreSQL itself builds (silver rows, dead letters, requeues) and calls it.
-- Upgrading rewrites the outbox table once (ALTER COLUMN ... TYPE), under its exclusive lock.

SET LOCAL search_path = oml, pg_catalog;

ALTER TABLE outbox ALTER COLUMN row_data TYPE json USING row_data::json;

-- The body of 0003's enqueue_outbox, for a json row: the tenant check, the xid BEFORE the seq
-- (ARCHITECTURE.md "The outbox cut"), the insert. The only writer of outbox rows.
CREATE FUNCTION enqueue_outbox_json(p_tenant uuid, p_target text, p_journal_seq bigint, p_row json)
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

-- The jsonb form, for rows built in SQL: the same function on the row's text.
CREATE OR REPLACE FUNCTION enqueue_outbox(p_tenant uuid, p_target text, p_journal_seq bigint, p_row jsonb)
RETURNS bigint LANGUAGE sql SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
  SELECT oml.enqueue_outbox_json(p_tenant, p_target, p_journal_seq, p_row::json)
$$;

REVOKE EXECUTE ON FUNCTION enqueue_outbox_json(uuid, text, bigint, json) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION enqueue_outbox_json(uuid, text, bigint, json) TO oml_app;
