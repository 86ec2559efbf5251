-- 0018: what each lake table must already hold (issue 18, "Lost or damaged commits").
-- docs/data/postgres-schema.md and docs/data/delta-tables.md describe it.
--
-- A table's Delta txn version says how far the table got; the frontier says how far every table
-- got; neither says how far a table got BEFORE an OS crash lost its newest commit files (the
-- local store did not fsync them) or an operator replaced it by an empty one. A table with no
-- rows of its own in a stretch of the stream (silver before the first promotion) is legitimately
-- behind the frontier, so "txn < frontier" alone cannot tell a lost commit. This row can: the lake
-- writer records, with every frontier advance and in the same statement, the batch end of each
-- table it committed. At every start and recovery a table whose Delta txn is below its recorded
-- txn has lost commits and is refilled from the outbox, exactly once (the rows above its txn).
-- A hint, not an authority: a value too high only makes the writer refill rows above the table's
-- own txn version, which it lacks anyway; the txn check stays the exactly-once authority.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

CREATE TABLE lake_table_txn (
  stream       text   NOT NULL REFERENCES lake_frontier(stream),
  table_name   text   NOT NULL,
  txn_version  bigint NOT NULL CHECK (txn_version >= 0),  -- the highest batch end committed to it
  updated_at   timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (stream, table_name)
);
ALTER TABLE lake_table_txn ENABLE ROW LEVEL SECURITY;
CREATE POLICY lake_table_txn_lakewriter ON lake_table_txn TO oml_lakewriter USING (true) WITH CHECK (true);
GRANT SELECT, INSERT ON lake_table_txn TO oml_lakewriter;
GRANT UPDATE (txn_version, updated_at) ON lake_table_txn TO oml_lakewriter;
