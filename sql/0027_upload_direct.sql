-- 0027: uploads write each chunk's ciphertext straight into their object (issue 22, "Uploads"):
-- an S3 multipart upload, or an append-only staging file on a local store, opened at the
-- session's staging key `<tenant>/uploads/<upload_id>/object` and made whole by the last PATCH
-- (src/uploads/uploads.h "Storage", src/blob/object_store.h "Resumable writes"). A session keeps
-- what a resume after kill -9 needs to continue that same write:
--   direct        true for sessions this version creates (it says so in its INSERT); false for
--                 older ones and for those a previous version still creates during a rolling
--                 upgrade, which finish the old way (part objects, composed at the last byte)
--   store_upload  the write's handle (S3: the UploadId; 'local'); NULL until the first part
--   store_parts   the ETags of the committed parts of an S3 multipart upload, part i at [i]
--                 (a local store's parts need none: empty)
--   carry_bytes   ciphertext not in a part yet (S3 parts but the last hold at least 5 MiB):
--                 the carry object `<tenant>/uploads/<upload_id>/carry-<ciphertext_offset>`
-- None of them is key material: upload_sessions_audit (the reconciler's view) shows the first
-- two as well, so an audit can tell a live multipart upload from a leftover.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

ALTER TABLE upload_sessions
  ADD COLUMN direct boolean NOT NULL DEFAULT false,
  ADD COLUMN store_upload text CONSTRAINT upload_sessions_store_upload_size CHECK (octet_length(store_upload) BETWEEN 1 AND 1024),
  ADD COLUMN store_parts text[] NOT NULL DEFAULT '{}',
  ADD COLUMN carry_bytes bigint NOT NULL DEFAULT 0 CONSTRAINT upload_sessions_carry_bytes CHECK (carry_bytes >= 0);
-- The default stays false: a server of the previous version (still serving during a rolling
-- upgrade) creates sessions it writes the old way, and they must stay legacy; this version
-- inserts direct = true explicitly.

CREATE OR REPLACE VIEW upload_sessions_audit AS
  SELECT tenant_id, upload_id, state, upload_length, upload_offset, ciphertext_offset, part_count, parts_left,
         created_at, updated_at, expires_at, completed_at, ciphertext_sha256, ciphertext_size, object_key,
         direct, store_upload
  FROM upload_sessions;
