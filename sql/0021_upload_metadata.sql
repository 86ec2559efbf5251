-- 0021: tus creation keeps the Upload-Metadata header as the client sent it (issue 19, "tus 1.0
-- and HTTP conformance"): a HEAD returns it unchanged, whatever order, spacing or extra keys it
-- had. The parsed digest, filename and media type stay in their own columns; this column is only
-- echoed. NULL for a session created before this migration (HEAD then re-encodes the parsed
-- keys). docs/data/postgres-schema.md describes the column.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

ALTER TABLE upload_sessions ADD COLUMN upload_metadata text
  CONSTRAINT upload_sessions_metadata_size CHECK (octet_length(upload_metadata) BETWEEN 1 AND 8192);
