-- 0008: the lake writer's role (issue 8, "Roles"). `oml lakewriter` connects as oml_lakewriter
-- (LOGIN NOSUPERUSER NOBYPASSRLS, created by db::Migrate's roles block, like oml_app). It may:
--   * read every tenant's outbox rows (policy outbox_lakewriter_read; the outbox stays under RLS
--     for everyone else) and the outbox sequence's last value (SELECT on outbox_seq: it can read
--     L, never draw a seq);
--   * read and update the frontier of each stream (lake_frontier), and read, insert and mark
--     requeued the dead letters (dead_letter);
-- and nothing else. It holds no privilege on journal, chain_heads, artifacts, artifact_bodies,
-- artifact_keys, api_keys, tenants or idempotency_*: it cannot read a DEK or a held body, and it
-- cannot write or change an event. The outbox is never deleted by it (see "Pruning" below).
--
-- materialize-skipped. A dead letter is journalled as a signed `materialize-skipped` event on the
-- row's tenant chain, in the same transaction that inserts its dead_letter row. The journal's
-- append path (lock_head, INSERT INTO journal, enqueue_outbox, advance_head) cannot be granted to
-- this role scoped to that one event type: INSERT on journal is all-or-nothing per event type,
-- and enqueue_outbox/advance_head would let it write any tenant's chain head. So this migration
-- grants none of it. The dead-letter journalling goes through one SECURITY DEFINER function,
-- added with the writer, that appends only an event of type `materialize-skipped` (checked in
-- the function) and inserts the dead_letter row in the same transaction.
--
-- Pruning. The writer never deletes outbox rows: it needs (frontier, batch_end] again after a
-- crash (recovery rebuilds the batch by seq range, never re-cuts), and the frontier is a cache,
-- not the recovery authority (the Delta log's txn version is). Rows at or below every table's
-- txn version can be pruned by a separate job as oml_owner (not built yet); until then the
-- outbox grows with the journal.
-- docs/data/postgres-schema.md describes every object.

SET LOCAL search_path = oml, pg_catalog;

-- One row per outbox stream: a sequence, a stable horizon, a frontier, a lease and a Delta appId
-- (src/lake/outbox_cut.h). One stream, "default" (the outbox table and outbox_seq), today; a
-- deployment sharded by tenant adds streams by migration.
CREATE TABLE lake_frontier (
  stream            text PRIMARY KEY CHECK (stream ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
  -- Every outbox row with seq <= frontier_seq is committed to every Delta table it touches.
  -- A cache for restart and lag metrics: each table's txn version is the recovery authority.
  frontier_seq      bigint NOT NULL DEFAULT 0 CHECK (frontier_seq >= 0),
  lease_holder      text,            -- who holds the writer lease (host:pid:uuid); NULL: nobody
  lease_epoch       bigint NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),  -- +1 at every takeover
  lease_expires_at  timestamptz,     -- a holder that does not renew by then loses the lease
  updated_at        timestamptz NOT NULL DEFAULT now()
);
INSERT INTO lake_frontier (stream) VALUES ('default');

-- A frontier never moves back and a lease epoch never decreases, for every role: a fenced writer
-- that lost its lease cannot regress either. (An operator rebuilding a lake from scratch
-- disables this trigger as the owner, on purpose.)
CREATE FUNCTION lake_frontier_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.stream <> OLD.stream THEN
    RAISE EXCEPTION 'a stream is never renamed' USING ERRCODE = 'insufficient_privilege', HINT = 'oml lake_frontier guard';
  END IF;
  IF NEW.frontier_seq < OLD.frontier_seq THEN
    RAISE EXCEPTION 'frontier of stream % may not move back (% -> %)', OLD.stream, OLD.frontier_seq, NEW.frontier_seq
      USING ERRCODE = 'insufficient_privilege', HINT = 'oml lake_frontier guard';
  END IF;
  IF NEW.lease_epoch < OLD.lease_epoch THEN
    RAISE EXCEPTION 'lease epoch of stream % may not decrease (% -> %)', OLD.stream, OLD.lease_epoch, NEW.lease_epoch
      USING ERRCODE = 'insufficient_privilege', HINT = 'oml lake_frontier guard';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER lake_frontier_guard BEFORE UPDATE ON lake_frontier
  FOR EACH ROW EXECUTE FUNCTION lake_frontier_guard();
REVOKE EXECUTE ON FUNCTION lake_frontier_guard() FROM PUBLIC;

-- Outbox rows the writer gave up on after its retry budget. Moved here (with their
-- materialize-skipped event) so the frontier can pass them; `oml dead-letter requeue ID`
-- re-enqueues one through a journalled event and sets requeued_at.
CREATE TABLE dead_letter (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  stream        text   NOT NULL REFERENCES lake_frontier(stream),
  outbox_seq    bigint NOT NULL CHECK (outbox_seq >= 1),
  tenant_id     uuid   NOT NULL REFERENCES tenants(tenant_id),
  target_table  text   NOT NULL,
  journal_seq   bigint NOT NULL CHECK (journal_seq >= 1),
  -- The outbox row's row_data: digest-only, references (digests, object keys) and never a body,
  -- kept whole so a requeue does not depend on the outbox row still being there.
  payload_ref   jsonb  NOT NULL,
  error         text   NOT NULL,
  attempts      integer NOT NULL CHECK (attempts >= 1),
  skipped_seq   bigint CHECK (skipped_seq >= 1),  -- seq of materialize-skipped on the tenant chain
  created_at    timestamptz NOT NULL DEFAULT now(),
  requeued_at   timestamptz,
  CONSTRAINT dead_letter_once UNIQUE (stream, outbox_seq)
);

-- Row-level security. The lake writer's policies name it: every other role keeps the per-tenant
-- view (outbox_scope) or sees nothing (lake_frontier, dead_letter: no policy for them).
CREATE POLICY outbox_lakewriter_read ON outbox FOR SELECT TO oml_lakewriter USING (true);
ALTER TABLE lake_frontier ENABLE ROW LEVEL SECURITY;
CREATE POLICY lake_frontier_lakewriter ON lake_frontier TO oml_lakewriter USING (true) WITH CHECK (true);
ALTER TABLE dead_letter ENABLE ROW LEVEL SECURITY;
CREATE POLICY dead_letter_lakewriter ON dead_letter TO oml_lakewriter USING (true) WITH CHECK (true);

-- Privileges of the lake writer: exactly these.
GRANT USAGE ON SCHEMA oml TO oml_lakewriter;
GRANT SELECT ON outbox TO oml_lakewriter;
GRANT SELECT ON SEQUENCE outbox_seq TO oml_lakewriter;  -- pg_sequence_last_value: L, not nextval
GRANT SELECT ON lake_frontier TO oml_lakewriter;
GRANT UPDATE (frontier_seq, lease_holder, lease_epoch, lease_expires_at, updated_at) ON lake_frontier TO oml_lakewriter;
GRANT SELECT, INSERT ON dead_letter TO oml_lakewriter;
GRANT UPDATE (requeued_at) ON dead_letter TO oml_lakewriter;
-- The outbox_scope policy applies to every role, so evaluating it calls current_tenant().
GRANT EXECUTE ON FUNCTION current_tenant() TO oml_lakewriter;
