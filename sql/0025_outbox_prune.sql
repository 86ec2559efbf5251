-- 0025: outbox pruning, and the journal feed that refills a table below what was pruned
-- (issue 20, "Outbox pruning"; issue 18, "rows re-derived from the journal").
--
-- The outbox held every row ever drawn. The lake writer, holding the stream's lease, now deletes
-- the rows at or below the frontier that are older than a retention, a bounded prefix at a time,
-- through prune_outbox (it has no DELETE on the outbox). Rows at or below the frontier are
-- committed to every table they touch (the frontier passes a batch only then), so recovery of a
-- healthy lake never needs them. A table that later turns out to lack some of them (lost commits,
-- `oml lake rebuild`) is refilled from the journal: the rows are the journal's own (the outbox
-- row is journal::BronzeRow of the event, a pure function of its signed bytes).
--
-- What a pruned row leaves behind, per stream:
--   * outbox_prune.pruned_through P: every outbox row with seq <= P is gone;
--   * outbox_prune_tenant.bronze_through mb(T) and silver_through ms(T): the highest journal seq
--     of tenant T whose bronze/events row, and whose silver/claims row, was pruned (0: none). A
--     tenant's rows enter the outbox in chain order (the commit point holds the tenant's chain
--     lock while it draws their seqs; an event's silver rows come before its bronze row), so the
--     bronze rows of T's events 1..mb(T) are gone and every later one is still in the outbox; the
--     silver rows of events below ms(T) are gone, those of later events are not, and event ms(T)
--     itself may have some of its silver rows on each side (P can fall inside one transaction):
--     re-applying one of those is harmless, since silver keeps a row only when newer by chain
--     seq. A requeued row (a dead letter's second delivery) names an event at or below its
--     tenant's mark, so it never raises one.
-- The original outbox seq of a pruned row is not kept (it would grow with the journal, which is
-- what pruning stops): a row re-derived from the journal carries outbox_seq 0 in the lake
-- (docs/data/delta-tables.md).
--
-- lake_journal_feed gives the writer the journal rows of pruned events only: exactly what it
-- read from the outbox before (the signed bytes, signature and hash of each event), nothing
-- newer, never a key; lake_body_locations where each claim's ciphertext lives (the
-- body_location its silver rows carried). Both functions require the caller's lease epoch, like the dead-letter ones.
-- docs/data/postgres-schema.md describes every object.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

CREATE TABLE outbox_prune (
  stream          text PRIMARY KEY REFERENCES lake_frontier(stream),
  pruned_through  bigint      NOT NULL DEFAULT 0 CHECK (pruned_through >= 0),
  rows_pruned     bigint      NOT NULL DEFAULT 0 CHECK (rows_pruned >= 0),
  updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_prune (stream) SELECT stream FROM lake_frontier;

CREATE TABLE outbox_prune_tenant (
  stream          text   NOT NULL REFERENCES outbox_prune(stream),
  tenant_id       uuid   NOT NULL REFERENCES tenants(tenant_id),
  bronze_through  bigint NOT NULL DEFAULT 0 CHECK (bronze_through >= 0),
  silver_through  bigint NOT NULL DEFAULT 0 CHECK (silver_through >= 0),
  PRIMARY KEY (stream, tenant_id)
);

-- The lease check of both functions: the caller holds the stream's lease at p_epoch.
CREATE FUNCTION lake_lease_check(p_stream text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
DECLARE
  v_front oml.lake_frontier;
BEGIN
  SELECT * INTO v_front FROM oml.lake_frontier WHERE stream = p_stream;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'unknown outbox stream %', p_stream USING ERRCODE = 'no_data_found';
  END IF;
  -- The lease is the holder's session-level advisory lock (lake/lakewriter.h: keys kLeaseClassId
  -- 0x6f6d6c77 and the appId's hash): the calling session must hold one, at the epoch it took.
  IF v_front.lease_epoch IS DISTINCT FROM p_epoch OR v_front.lease_holder IS NULL
     OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                     WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.granted
                       AND l.classid = 1869442167::oid AND l.objsubid = 2) THEN
    RAISE EXCEPTION 'the lake writer lease of stream % is not held at epoch %', p_stream, p_epoch
      USING ERRCODE = 'insufficient_privilege', HINT = 'oml lease-lost';
  END IF;
END $$;

-- Deletes the next prefix of the stream's outbox: the rows above pruned_through, at most
-- p_limit of them, at or below the frontier, up to (not including) the first one enqueued less
-- than p_retention_s seconds ago. Records the new pruned_through and each tenant's mark in the
-- same transaction. Returns the rows deleted and pruned_through (unchanged when nothing was due).
-- Prunes of one stream are serialized by the outbox_prune row lock.
CREATE FUNCTION prune_outbox(p_stream text, p_epoch bigint, p_retention_s bigint, p_limit integer)
RETURNS TABLE (rows_pruned bigint, pruned_through bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
DECLARE
  v_frontier bigint;
  v_from bigint;
  v_to bigint;
  v_n bigint;
BEGIN
  IF p_stream IS DISTINCT FROM 'default' THEN
    -- One stream today: the outbox table is the "default" stream's (lake/outbox_cut.h).
    RAISE EXCEPTION 'unknown outbox stream %', p_stream USING ERRCODE = 'no_data_found';
  END IF;
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000000 OR p_retention_s IS NULL OR p_retention_s < 0 THEN
    RAISE EXCEPTION 'prune_outbox: limit must be 1..1000000 and retention >= 0 (got %, %)', p_limit, p_retention_s
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM oml.lake_lease_check(p_stream, p_epoch);
  SELECT p.pruned_through INTO v_from FROM oml.outbox_prune p WHERE p.stream = p_stream FOR UPDATE;
  -- The frontier only moves forward: a value read now is safe to prune up to.
  SELECT f.frontier_seq INTO v_frontier FROM oml.lake_frontier f WHERE f.stream = p_stream;
  SELECT coalesce(max(w.seq), v_from) INTO v_to FROM (
    SELECT c.seq, bool_or(c.enqueued_at > now() - make_interval(secs => p_retention_s))
                    OVER (ORDER BY c.seq) AS young_seen
      FROM (SELECT o.seq, o.enqueued_at FROM oml.outbox o
             WHERE o.seq > v_from AND o.seq <= v_frontier ORDER BY o.seq LIMIT p_limit) c
  ) w WHERE NOT w.young_seen;
  IF v_to <= v_from THEN
    RETURN QUERY SELECT 0::bigint, v_from;
    RETURN;
  END IF;
  WITH gone AS (
    DELETE FROM oml.outbox o WHERE o.seq > v_from AND o.seq <= v_to RETURNING o.tenant_id, o.target_table, o.journal_seq
  ), marks AS (
    SELECT g.tenant_id,
           coalesce(max(g.journal_seq) FILTER (WHERE g.target_table = 'bronze/events'), 0) AS mb,
           coalesce(max(g.journal_seq) FILTER (WHERE g.target_table = 'silver/claims'), 0) AS ms,
           count(*) AS n
      FROM gone g GROUP BY g.tenant_id
  ), upsert AS (
    INSERT INTO oml.outbox_prune_tenant AS t (stream, tenant_id, bronze_through, silver_through)
      SELECT p_stream, m.tenant_id, m.mb, m.ms FROM marks m
    ON CONFLICT (stream, tenant_id)
      DO UPDATE SET bronze_through = greatest(t.bronze_through, excluded.bronze_through),
                    silver_through = greatest(t.silver_through, excluded.silver_through)
  )
  SELECT coalesce(sum(m.n), 0)::bigint INTO v_n FROM marks m;
  UPDATE oml.outbox_prune p SET pruned_through = v_to, rows_pruned = p.rows_pruned + v_n, updated_at = now()
   WHERE p.stream = p_stream;
  RETURN QUERY SELECT v_n, v_to;
END $$;

-- The journal rows of tenant p_tenant with p_after < seq <= the higher of its marks (events with a
-- pruned row only), in
-- chain order, at most p_limit. The writer turns each into the row the outbox held
-- (journal::BronzeRow). Needs the lease: only a writer refilling a table reads it.
CREATE FUNCTION lake_journal_feed(p_stream text, p_epoch bigint, p_tenant uuid, p_after bigint, p_limit integer)
RETURNS TABLE (seq bigint, event_hash bytea, signed_bytes bytea, signature bytea)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
DECLARE
  v_mark bigint;
BEGIN
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 100000 THEN
    RAISE EXCEPTION 'lake_journal_feed: limit must be 1..100000 (got %)', p_limit USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM oml.lake_lease_check(p_stream, p_epoch);
  SELECT greatest(t.bronze_through, t.silver_through) INTO v_mark FROM oml.outbox_prune_tenant t
   WHERE t.stream = p_stream AND t.tenant_id = p_tenant;
  IF v_mark IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT j.seq, j.event_hash, j.signed_bytes, j.signature FROM oml.journal j
    WHERE j.tenant_id = p_tenant AND j.seq > p_after AND j.seq <= v_mark ORDER BY j.seq LIMIT p_limit;
END $$;

-- Where each ever-promoted claim version's ciphertext lives, for the body_location of a
-- re-derived silver row (sql/0015 silver_claim_row): what the writer read in its silver outbox
-- rows, never the ciphertext or a key, never a held claim's.
CREATE FUNCTION lake_body_locations(p_stream text, p_epoch bigint, p_tenant uuid)
RETURNS TABLE (artifact_id uuid, version integer, location text, object_key text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
BEGIN
  PERFORM oml.lake_lease_check(p_stream, p_epoch);
  RETURN QUERY SELECT b.artifact_id, b.version, b.location, coalesce(b.object_key, '') FROM oml.artifact_bodies b
    JOIN oml.artifacts a USING (tenant_id, artifact_id, version)
    WHERE b.tenant_id = p_tenant AND a.promoted_seq IS NOT NULL;
END $$;

REVOKE EXECUTE ON FUNCTION lake_lease_check(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lake_body_locations(text, bigint, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lake_body_locations(text, bigint, uuid) TO oml_lakewriter;
REVOKE EXECUTE ON FUNCTION prune_outbox(text, bigint, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION lake_journal_feed(text, bigint, uuid, bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION prune_outbox(text, bigint, bigint, integer) TO oml_lakewriter;
GRANT EXECUTE ON FUNCTION lake_journal_feed(text, bigint, uuid, bigint, integer) TO oml_lakewriter;
GRANT SELECT ON outbox_prune, outbox_prune_tenant TO oml_lakewriter;
