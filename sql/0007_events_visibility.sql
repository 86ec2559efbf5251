-- 0007: who may read what (issue 7 section 5).
--   * GET /v1/events shows a writer only the events that concern it (admission/events.h). Its
--     page is found through the fold tables, by principal and seq; these indexes make each
--     branch of that query an index range scan cut at the page size, whatever the chain length.
--   * The provider tenant gets no API keys: its chain records deployment acts, and no API
--     caller may write to it or read it. `oml key create --tenant provider` refuses first
--     (exit 7); this trigger refuses any other way in, and authenticate() ignores a provider key
--     made before 0007 (revoke it with `oml key revoke --tenant provider`).
-- docs/data/postgres-schema.md describes every object.

SET LOCAL search_path = oml, pg_catalog;

-- claim.submitted (submitted_seq) and artifact.erased (erased_seq) of a principal's claims.
CREATE INDEX artifacts_principal_submitted ON artifacts (tenant_id, principal, submitted_seq);
CREATE INDEX artifacts_principal_erased ON artifacts (tenant_id, principal, erased_seq)
  WHERE erased_seq IS NOT NULL;
-- claim.submitted of claims every member of the tenant may read (neither held nor erased).
CREATE INDEX artifacts_readable_submitted ON artifacts (tenant_id, submitted_seq)
  WHERE state NOT IN ('held', 'erased');
-- api_key.created / api_key.revoked of a principal's keys.
CREATE INDEX api_keys_principal ON api_keys (tenant_id, principal);

-- Raises check_violation (23514) for an API key of the provider tenant. A trigger, not a CHECK:
-- a CHECK would also refuse the UPDATE that revokes a provider key made before 0007.
CREATE FUNCTION api_keys_not_provider() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.tenant_id = oml.provider_tenant() THEN
    RAISE EXCEPTION 'the provider tenant has no API keys'
      USING ERRCODE = 'check_violation', CONSTRAINT = 'api_keys_not_provider', HINT = 'oml api_keys guard';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER api_keys_not_provider BEFORE INSERT ON api_keys
  FOR EACH ROW EXECUTE FUNCTION api_keys_not_provider();
REVOKE EXECUTE ON FUNCTION api_keys_not_provider() FROM PUBLIC;

-- Authentication (replaces 0001's, same signature and rights): a key of the provider tenant
-- authenticates nobody.
CREATE OR REPLACE FUNCTION authenticate(p_hash bytea, OUT tenant_id uuid, OUT principal text, OUT role text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog AS $$
  SELECT k.tenant_id, k.principal, k.role FROM oml.api_keys k
  WHERE k.key_hash = p_hash AND k.revoked_at IS NULL AND k.tenant_id <> oml.provider_tenant()
$$;
