-- 0005_idempotency_keys: Idempotent writes (issue 6 section 1, Idempotency-Key).
--
-- POST /v1/claims and POST /v1/claims/{id}/erase take an optional `Idempotency-Key` header
-- (IETF httpapi draft "The Idempotency-Key HTTP Header Field"). The first write with a key
-- records here, IN ITS COMMIT-POINT TRANSACTION (fold statements of its event, after the journal
-- insert), the response it answers. A crash can therefore never keep the event without its
-- record, or the record without its event. A later request with the same API key and the same
-- key gets:
--   * the recorded response (status, body, and the receipt re-read from the journal row at
--     journal_seq) when its request fingerprint equals request_sha256;
--   * 422 idempotency-key-reused when it differs;
-- as long as the row has not expired. A concurrent duplicate that slipped past the lookup fails
-- on the primary key (23505 on idempotency_keys_pkey) inside its own transaction, which rolls
-- back: no second event. Its caller then answers from the winner's row.
-- Keys are scoped to the API key (the PK), so two API keys never share a key, even in one tenant.
-- docs/data/postgres-schema.md describes every column.

SET LOCAL search_path = oml, pg_catalog;

CREATE TABLE idempotency_keys (
  tenant_id        uuid    NOT NULL REFERENCES tenants(tenant_id),
  api_key_hash     bytea   NOT NULL REFERENCES api_keys(key_hash),  -- SHA-256 of the caller's token
  idem_key         text    NOT NULL CHECK (idem_key ~ '^[ -~]{1,255}$'),  -- 1..255 printable ASCII
  -- SHA-256 over method, request path and the exact body bytes (server.cc documents the framing).
  request_sha256   bytea   NOT NULL CHECK (length(request_sha256) = 32),
  response_status  integer NOT NULL CHECK (response_status BETWEEN 200 AND 299),
  -- The response document without its "receipt" member, which is rebuilt from journal_seq.
  response_body    jsonb   NOT NULL CHECK (jsonb_typeof(response_body) = 'object'),
  -- Seq of the write's event on the tenant's chain. No foreign key, like outbox.journal_seq: the
  -- row is inserted in that event's transaction, and a key to journal would stand in the way of
  -- its append-only guard (TRUNCATE journal would fail on the key before reaching the trigger).
  journal_seq      bigint  NOT NULL CHECK (journal_seq >= 1),
  created_at       timestamptz NOT NULL DEFAULT now(),
  expires_at       timestamptz NOT NULL,
  CONSTRAINT idempotency_keys_pkey PRIMARY KEY (api_key_hash, idem_key),
  CONSTRAINT idempotency_keys_expiry CHECK (expires_at > created_at)
);
-- The bounded purge of a tenant's expired rows (see "Write path" below).
CREATE INDEX idempotency_keys_expiry_idx ON idempotency_keys (tenant_id, expires_at);

-- Write path (admission/claims.cc), fold statements of the event, in this order:
--   1. DELETE the tenant's expired rows: this key's own row if it expired, plus at most 8 of the
--      oldest others (the "lazy" deletion; every idempotent write removes more than it adds, so
--      the backlog of expired rows drains).
--   2. INSERT the row, expires_at = now() + idempotency_ttl_s. now() is the transaction's start,
--      so a record expires ttl after its write began.
-- Read path: SELECT ... WHERE api_key_hash = $1 AND idem_key = $2 AND expires_at > now(), joined
-- to the journal row at journal_seq. Expired rows are ignored even before they are deleted.

-- Row-level security: per tenant, as every tenant-scoped table. One policy per command, because
-- the application may delete only EXPIRED rows (policies of one command are OR-ed, so an ALL
-- policy would allow deleting live ones). There is no UPDATE: a recorded response never changes.
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY idempotency_keys_read ON idempotency_keys FOR SELECT
  USING (tenant_id = current_tenant());
CREATE POLICY idempotency_keys_record ON idempotency_keys FOR INSERT
  WITH CHECK (tenant_id = current_tenant());
CREATE POLICY idempotency_keys_expire ON idempotency_keys FOR DELETE
  USING (tenant_id = current_tenant() AND expires_at <= now());

GRANT SELECT, INSERT, DELETE ON idempotency_keys TO oml_app;

-- The replay fence (admission/claims.cc, Recorded): before a recorded response is replayed, the
-- replaying request commits a write of its own to this table. That commit lies later in the WAL
-- than the recorded event, so when the synchronous standbys confirm it they have the event too;
-- if they do not, the replay is refused (503 commit-not-replicated). A transaction that only
-- takes an xid writes no WAL and would not wait for the standbys: hence a real row. One row per
-- tenant, overwritten.
CREATE TABLE idempotency_fence (
  tenant_id  uuid PRIMARY KEY REFERENCES tenants(tenant_id),
  fenced_at  timestamptz NOT NULL
);
ALTER TABLE idempotency_fence ENABLE ROW LEVEL SECURITY;
CREATE POLICY idempotency_fence_scope ON idempotency_fence
  USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
GRANT SELECT, INSERT, UPDATE ON idempotency_fence TO oml_app;
