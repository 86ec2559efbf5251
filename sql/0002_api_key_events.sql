-- 0002: API keys become journalled facts. `oml key create` journals api_key.created and
-- `oml key revoke` journals api_key.revoked on the tenant's chain, each in the same transaction
-- as its row change here; the seqs link the row to those events.
-- docs/data/postgres-schema.md describes every column.

SET LOCAL search_path = oml, pg_catalog;

ALTER TABLE api_keys
  ADD COLUMN created_seq bigint CHECK (created_seq >= 1),  -- NULL: inserted outside oml (e.g. by hand)
  ADD COLUMN revoked_seq bigint CHECK (revoked_seq >= 1),
  ADD CONSTRAINT api_keys_revoked_seq_has_time CHECK (revoked_seq IS NULL OR revoked_at IS NOT NULL);

GRANT UPDATE (revoked_seq) ON api_keys TO oml_app;
