-- 0002: API keys become journalled facts. `oml key create` journals api_key.created and
-- `oml key revoke` journals api_key.revoked on the tenant's chain, each in the same transaction
-- as its row change here; the seqs link the row to those events. Writes made with an API key
-- check, inside their own transaction (under the tenant's chain lock), that the key is still
-- live, so no event by a key can follow that key's api_key.revoked in the chain.
-- docs/data/postgres-schema.md describes every column.

SET LOCAL search_path = oml, pg_catalog;

ALTER TABLE api_keys
  ADD COLUMN created_seq bigint CHECK (created_seq >= 1),  -- NULL: made before 0002, or outside oml
  ADD COLUMN revoked_seq bigint CHECK (revoked_seq >= 1),
  ADD CONSTRAINT api_keys_revoked_seq_has_time CHECK (revoked_seq IS NULL OR revoked_at IS NOT NULL);

GRANT UPDATE (revoked_seq) ON api_keys TO oml_app;

-- Raises SQLSTATE OMKEY unless p_hash (SHA-256 of a token) is a live key of the transaction's
-- tenant. Journal appends call it, after the journal insert, for every event written with an
-- API key (EventSpec::api_key_hash).
CREATE FUNCTION require_live_api_key(p_hash bytea) RETURNS void LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM oml.api_keys
                 WHERE key_hash = p_hash AND tenant_id = oml.current_tenant() AND revoked_at IS NULL) THEN
    RAISE EXCEPTION 'API key ak_% is revoked', encode(substr(p_hash, 1, 8), 'hex') USING ERRCODE = 'OMKEY';
  END IF;
END $$;
REVOKE EXECUTE ON FUNCTION require_live_api_key(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION require_live_api_key(bytea) TO oml_app;
