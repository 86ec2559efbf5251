-- 0006_kek_id: the KEK id of every wrapped DEK, and KEK rotation (issue 7 section 7).
--
-- artifact_keys.kek_id (since 0001) names the KEK that wrapped the row's DEK. From this migration
-- on it is the contract readers and `oml kek rotate` rely on:
--   * Readers (admission/claims.cc, Fetch) unwrap each DEK under the KEK its row names, so while
--     a rotation is under way DEKs under the old and the new KEK are read side by side.
--   * `oml kek rotate` (admission/kek_rotation.h) re-wraps DEKs in batches, one transaction per
--     batch: each row's UPDATE sets wrapped_dek and kek_id together, guarded by the old kek_id, so
--     at every instant each DEK is wrapped under exactly one KEK and its row says which. A crash
--     between batches leaves some rows under each KEK; a re-run finishes.
--   * Erasure still DELETEs the row. The rotation only UPDATEs rows that exist (never inserts),
--     so an erased DEK stays destroyed.
--
-- A KEK id is an identifier derived from the key (crypto/crypto.h, FileKekProvider: "file:" and 16
-- hex digits of a domain-separated SHA-256 of the key), never the key. The CHECK keeps it that
-- shape: 16 hex digits are 64 bits, so a hex-encoded 256-bit key can never be stored here by
-- mistake.
-- docs/data/postgres-schema.md describes every column.

SET LOCAL search_path = oml, pg_catalog;

ALTER TABLE artifact_keys
  ADD CONSTRAINT artifact_keys_kek_id_shape CHECK (kek_id ~ '^[a-z][a-z0-9]*:[0-9a-f]{16}$');

COMMENT ON COLUMN artifact_keys.kek_id IS
  'Id of the KEK that wrapped wrapped_dek ("file:" + 16 hex of SHA-256("oml-kek-id/v1" || 0x00 || KEK); '
  'rows written before 0006 may carry the legacy "file:" + 16 hex of SHA-256(KEK)). Never key material.';

-- The rotation re-wraps in place: oml_app may change exactly these two columns (RLS scopes the
-- rows to the tenant set by oml.tenant_id, as for every other statement on this table).
GRANT UPDATE (kek_id, wrapped_dek) ON artifact_keys TO oml_app;
