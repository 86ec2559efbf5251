-- 0013_attachments: a claim's attachments, their keys, and what was served to which reviewer
-- (issue 9, "Naming, binding, the signed unit" and "Admission lifecycle"). admission/attachments.h
-- is the only writer; docs/data/postgres-schema.md describes every column.
--
--   * A completed upload (sql/0011) is attached by the claim that names it: claim.submitted lists
--     every attachment's digests (the claim's envelope binds them) and each file gets its own
--     submission.attach event, all in one commit-point transaction. The fold of submission.attach
--     inserts the attachments row, MOVES the upload's wrapped DEK into attachment_keys and deletes
--     the upload session, guarded so that an upload that is not complete (or was attached by a
--     racing claim) fails the whole transaction.
--   * Objects are named by ciphertext digest (<tenant>/<ciphertext_sha256 hex>) and each
--     attachment has its own DEK: two claims with the same file share neither a name nor a key,
--     so erasing one never touches the other's file. Erasure deletes the attachment's key row
--     (crypto-shredding) and then the object.
--   * location says which bucket holds the ciphertext: quarantine while held or rejected, bodies
--     once promoted (the same bytes, copied, digest unchanged), none after erasure.
--   * review_served records each review.served event: a verdict counts only after the reviewer
--     was served every attachment (409 attachments-not-served before that).

SET LOCAL search_path = oml, pg_catalog;

CREATE TABLE attachments (
  tenant_id          uuid     NOT NULL,
  artifact_id        uuid     NOT NULL,
  version            integer  NOT NULL,
  ordinal            smallint NOT NULL CHECK (ordinal BETWEEN 1 AND 64),  -- 1.. in submission order
  upload_id          uuid     NOT NULL,  -- the upload session it came from (AAD of key and ciphertext)
  plaintext_sha256   bytea    NOT NULL CHECK (length(plaintext_sha256) = 32),
  ciphertext_sha256  bytea    NOT NULL CHECK (length(ciphertext_sha256) = 32),
  size_bytes         bigint   NOT NULL CHECK (size_bytes >= 0),
  ciphertext_size    bigint   NOT NULL CHECK (ciphertext_size >= 0),
  media_type         text     NOT NULL,
  filename           text,
  object_key         text     NOT NULL,  -- <tenant>/<ciphertext_sha256 hex>, the same in both buckets
  location           text     NOT NULL DEFAULT 'quarantine' CHECK (location IN ('quarantine', 'bodies', 'none')),
  review             jsonb    NOT NULL,  -- review/review.h ReviewToJson: kind, method, types, flags, hit ids
  flagged            boolean  NOT NULL,  -- the review found a deny-list hit or an infection
  attach_seq         bigint   NOT NULL CHECK (attach_seq >= 1),  -- its submission.attach event
  PRIMARY KEY (tenant_id, artifact_id, version, ordinal),
  UNIQUE (tenant_id, upload_id),
  FOREIGN KEY (tenant_id, artifact_id, version) REFERENCES artifacts
);

-- The attachment's DEK, wrapped under the KEK kek_id with AAD "oml-upload-dek|<tenant>|<upload_id>"
-- (moved here from upload_sessions by submission.attach). Deleted by erasure.
CREATE TABLE attachment_keys (
  tenant_id    uuid NOT NULL REFERENCES tenants(tenant_id),
  upload_id    uuid NOT NULL,
  kek_id       text NOT NULL,
  wrapped_dek  bytea NOT NULL,
  PRIMARY KEY (tenant_id, upload_id)
);

-- One row per (claim version, item, reviewer) served while the claim was held: item 0 is the body,
-- item n the attachment with ordinal n. served_seq: the first review.served event for it.
CREATE TABLE review_served (
  tenant_id    uuid     NOT NULL,
  artifact_id  uuid     NOT NULL,
  version      integer  NOT NULL,
  item         smallint NOT NULL CHECK (item BETWEEN 0 AND 64),
  reviewer     text     NOT NULL,  -- the principal served
  served_seq   bigint   NOT NULL CHECK (served_seq >= 1),
  PRIMARY KEY (tenant_id, artifact_id, version, item, reviewer),
  FOREIGN KEY (tenant_id, artifact_id, version) REFERENCES artifacts
);

-- The deny-list gate's result on the inline body, as signed in claim.submitted ("review").
ALTER TABLE artifacts ADD COLUMN body_review jsonb;

DO $$
DECLARE t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['attachments', 'attachment_keys', 'review_served'] LOOP
    EXECUTE format('ALTER TABLE oml.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('CREATE POLICY %I ON oml.%I USING (tenant_id = oml.current_tenant()) '
                   'WITH CHECK (tenant_id = oml.current_tenant())', t || '_scope', t);
  END LOOP;
END $$;

GRANT SELECT, INSERT ON attachments, review_served TO oml_app;
GRANT UPDATE (location) ON attachments TO oml_app;
GRANT SELECT, INSERT, DELETE ON attachment_keys TO oml_app;
GRANT UPDATE (kek_id, wrapped_dek) ON attachment_keys TO oml_app;  -- `oml kek rotate` re-wraps
