-- 0024: what `oml reconcile` found, run by run (issue 20: "Metrics ... last run time; a doctor
-- line"; the incremental checkpoint). The reconciler's one write: it INSERTs a row at the end of
-- every run (and may read them back); nobody updates or deletes one but the owner. `oml doctor`
-- (as oml_app) reads the newest whole-deployment run. docs/data/postgres-schema.md describes it.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

CREATE TABLE reconcile_runs (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  stream       text        NOT NULL,
  tenant_id    uuid,                     -- --tenant; NULL: every tenant
  started_at   timestamptz NOT NULL,
  finished_at  timestamptz NOT NULL DEFAULT now(),
  findings     integer     NOT NULL CHECK (findings >= 0),
  classes      jsonb       NOT NULL,     -- {"<class>": count} of the findings
  events       bigint      NOT NULL CHECK (events >= 0),   -- journal events audited
  objects      boolean     NOT NULL,     -- the buckets were compared (not --no-objects)
  repaired     integer     NOT NULL DEFAULT 0 CHECK (repaired >= 0),  -- lake.repair events journalled
  -- What was audited: each table's version and txn, each chain's head seq (the incremental
  -- checkpoint reads it).
  checkpoint   jsonb       NOT NULL,
  CHECK (finished_at >= started_at)
);

GRANT SELECT, INSERT ON reconcile_runs TO oml_reconciler;
GRANT SELECT ON reconcile_runs TO oml_app;
