-- 0011_uploads: resumable upload sessions (issue 9, "Uploads speak tus 1.0"). src/uploads/uploads.h
-- is the only writer; docs/data/uploads.md draws the state machine and the storage layout.
--
--   * A session belongs to the API key that created it (api_key_id): every read and write of the
--     application filters on (tenant_id, upload_id, api_key_id), so another key, even of the same
--     tenant, finds nothing (404).
--   * It declares its length and the plaintext SHA-256 of the whole file at creation.
--   * Each chunk is encrypted as it arrives under the session's own DEK (wrapped_dek under the
--     KEK kek_id, AAD "oml-upload-dek|<tenant>|<upload_id>"), its ciphertext put as a part object
--     in the quarantine bucket, and upload_offset then advanced in a short transaction guarded on
--     the offset it read. One request at a time per session: it holds the session's advisory lock
--     (pg_try_advisory_lock(0x6f6d6c75, hashtext(tenant_id || '/' || upload_id)), session level,
--     no transaction open during object-store I/O); a second one is refused, never queued.
--   * What a resume needs lives in the row: the whole AEAD stream state (segment size, nonce
--     prefix, next segment index, header flag, the plaintext of the trailing partial segment) and
--     the running SHA-256 state of the plaintext, both sealed under the DEK with upload_offset in
--     their AAD (a row whose stream does not open under its offset, or stands elsewhere, is
--     refused); the running SHA-256 state of the ciphertext in the clear. A restart re-hashes
--     nothing.
--   * Final states (failed, expired, cancelled) keep no key material (CHECK below): the row stays
--     as a key-less tombstone, so the session answers 410/404, until the sweep deletes it. A
--     complete session that no claim attaches within upload_complete_ttl_s expires the same way.
-- docs/data/postgres-schema.md describes every column.

SET LOCAL search_path = oml, pg_catalog;

CREATE TABLE upload_sessions (
  tenant_id            uuid    NOT NULL REFERENCES tenants(tenant_id),
  upload_id            uuid    NOT NULL,
  api_key_id           text    NOT NULL CHECK (api_key_id ~ '^ak_[0-9a-f]{16}$'),  -- the creating key
  principal            text    NOT NULL,  -- the creating key's principal
  state                text    NOT NULL DEFAULT 'created'
                       CHECK (state IN ('created', 'receiving', 'complete', 'failed', 'expired', 'cancelled')),
  upload_length        bigint  NOT NULL CHECK (upload_length >= 0),       -- declared plaintext size
  declared_sha256      bytea   NOT NULL CHECK (length(declared_sha256) = 32),
  filename             text    CHECK (length(filename) BETWEEN 1 AND 255),
  media_type           text    NOT NULL CHECK (length(media_type) BETWEEN 3 AND 255),
  upload_offset        bigint  NOT NULL DEFAULT 0 CHECK (upload_offset BETWEEN 0 AND upload_length),
  -- The session's DEK, wrapped under the KEK kek_id (as artifact_keys); NULL once final but complete.
  kek_id               text    CHECK (kek_id ~ '^[a-z][a-z0-9]*:[0-9a-f]{16}$'),
  wrapped_dek          bytea,
  -- The AEAD stream (crypto/crypto.h framing) as created: segment size and nonce prefix (also in
  -- the object's header). Fixed; stream_sealed holds them too and must agree.
  segment_size         integer NOT NULL CHECK (segment_size BETWEEN 1 AND 16777216),
  nonce_prefix         bytea   NOT NULL CHECK (length(nonce_prefix) = 7),
  -- crypto::EncryptAll(DEK, "oml-upload-stream|<tenant>|<upload_id>|<upload_offset>", state): the
  -- stream's whole state at upload_offset (uploads::EncodeStreamState: segment size, nonce prefix,
  -- next segment index, header flag, the plaintext not yet in a whole segment).
  stream_sealed        bytea,
  -- crypto::EncryptAll(DEK, "oml-upload-sha|<tenant>|<upload_id>|<upload_offset>", SHA256_CTX):
  -- the running SHA-256 of the plaintext so far (uploads/running_sha256.h).
  plaintext_sha_sealed bytea,
  -- The running SHA-256 (SHA256_CTX bytes) of the ciphertext in the parts so far.
  ciphertext_sha_state bytea   CHECK (length(ciphertext_sha_state) = 112),
  ciphertext_offset    bigint  NOT NULL DEFAULT 0 CHECK (ciphertext_offset >= 0),  -- bytes in the parts
  part_count           integer NOT NULL DEFAULT 0 CHECK (part_count >= 0),         -- committed parts
  -- Part objects (<tenant>/uploads/<upload_id>/NNNNNNNN) may still exist in the quarantine
  -- bucket. Set with the first part; cleared once a final session's parts are deleted.
  parts_left           boolean NOT NULL DEFAULT false,
  created_at           timestamptz NOT NULL DEFAULT now(),
  updated_at           timestamptz NOT NULL DEFAULT now(),   -- last state or offset change
  -- Active: creation + upload_expiry_s (tus Upload-Expires); complete: completion +
  -- upload_complete_ttl_s (then expired unless a claim attached it).
  expires_at           timestamptz NOT NULL,
  -- Set on completion.
  completed_at         timestamptz,
  plaintext_sha256     bytea   CHECK (length(plaintext_sha256) = 32),
  ciphertext_sha256    bytea   CHECK (length(ciphertext_sha256) = 32),
  ciphertext_size      bigint  CHECK (ciphertext_size >= 0),
  -- <tenant>/<ciphertext_sha256 hex> in the quarantine bucket. Recorded before the object is
  -- composed (the session still receiving), so a crash before the completion's commit leaves a
  -- row naming it; an ended session's object is deleted, then this is cleared.
  object_key           text,
  PRIMARY KEY (tenant_id, upload_id),
  CONSTRAINT upload_sessions_key_pair CHECK ((kek_id IS NULL) = (wrapped_dek IS NULL)),
  CONSTRAINT upload_sessions_active CHECK (
    state NOT IN ('created', 'receiving') OR (wrapped_dek IS NOT NULL AND stream_sealed IS NOT NULL
                                               AND plaintext_sha_sealed IS NOT NULL AND ciphertext_sha_state IS NOT NULL)),
  -- (A complete session that is later cancelled or expires keeps its digests and completed_at.)
  CONSTRAINT upload_sessions_complete CHECK (
    state <> 'complete' OR (completed_at IS NOT NULL AND plaintext_sha256 IS NOT NULL AND ciphertext_sha256 IS NOT NULL
                            AND ciphertext_size IS NOT NULL AND object_key IS NOT NULL)),
  CONSTRAINT upload_sessions_complete_whole CHECK (
    state <> 'complete' OR (upload_offset = upload_length AND wrapped_dek IS NOT NULL
                            AND plaintext_sha256 = declared_sha256 AND stream_sealed IS NULL)),
  -- A final session but complete keeps no key material and no state.
  CONSTRAINT upload_sessions_shredded CHECK (
    state NOT IN ('failed', 'expired', 'cancelled') OR (wrapped_dek IS NULL AND stream_sealed IS NULL
                                                         AND plaintext_sha_sealed IS NULL AND ciphertext_sha_state IS NULL)),
  -- An ended session that still names an object has it still to delete.
  CONSTRAINT upload_sessions_object_pending CHECK (
    state NOT IN ('failed', 'expired', 'cancelled') OR object_key IS NULL OR parts_left)
);
-- The sweep: sessions by expiry (active ones, and complete ones past upload_complete_ttl_s);
-- ended sessions with parts or an object still to delete; tombstones.
CREATE INDEX upload_sessions_expiring ON upload_sessions (tenant_id, expires_at)
  WHERE state IN ('created', 'receiving', 'complete');
CREATE INDEX upload_sessions_parts_left ON upload_sessions (tenant_id) WHERE parts_left AND state NOT IN ('created', 'receiving');
CREATE INDEX upload_sessions_tombstones ON upload_sessions (tenant_id, updated_at) WHERE state IN ('failed', 'expired', 'cancelled');

ALTER TABLE upload_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY upload_sessions_scope ON upload_sessions
  USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

-- The tenants that have sweep work (Uploads::Sweep then works in each tenant's scope): an
-- overdue active or complete session, a final session with parts left, or a tombstone older than
-- p_retention. SECURITY DEFINER (the owner is not subject to RLS); it reveals tenant ids only.
CREATE FUNCTION upload_sweep_tenants(p_retention interval) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
  SELECT DISTINCT s.tenant_id FROM oml.upload_sessions s
  WHERE (s.state IN ('created', 'receiving', 'complete') AND s.expires_at <= now())
     OR (s.parts_left AND s.state NOT IN ('created', 'receiving'))
     OR (s.state IN ('failed', 'expired', 'cancelled') AND s.updated_at <= now() - p_retention)
$$;
REVOKE EXECUTE ON FUNCTION upload_sweep_tenants(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION upload_sweep_tenants(interval) TO oml_app;

-- DELETE: the sweep removes tombstones (final, key-less rows). `oml kek rotate` re-wraps
-- wrapped_dek in place (UPDATE of kek_id, wrapped_dek), like artifact_keys.
GRANT SELECT, INSERT, UPDATE, DELETE ON upload_sessions TO oml_app;
