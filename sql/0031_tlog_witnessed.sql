-- 0031: witness cosignatures on each chain's checkpoint (issue 23, journal/tlog_store.h).
--
-- tlog_state.witnessed: the stored checkpoint note carries the cosignatures (C2SP
--   tlog-cosignature, cosignature/v1) of a quorum of the witnesses configured when it was
--   cosigned; with witnesses configured, only such a checkpoint is published. A new checkpoint
--   is stored unwitnessed (false) and gains its cosignatures in a second transaction.
-- tlog_pending(p_signer, p_witnessed): as tlog_pending(p_signer) (0030), and, when the caller
--   has witnesses configured (p_witnessed), a chain whose checkpoint is not yet witnessed is work.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

ALTER TABLE tlog_state ADD COLUMN witnessed boolean NOT NULL DEFAULT false;

CREATE FUNCTION tlog_pending(p_signer text, p_witnessed boolean) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
  SELECT h.tenant_id FROM oml.chain_heads h LEFT JOIN oml.tlog_state s USING (tenant_id)
   WHERE h.tree_size IS NOT NULL
     AND (s.tenant_id IS NULL OR h.tree_size > s.verified_size
          OR s.checkpoint_size IS DISTINCT FROM s.verified_size OR s.published_size <> s.checkpoint_size
          OR s.signed_by IS DISTINCT FROM p_signer OR (p_witnessed AND NOT s.witnessed))
$$;
REVOKE EXECUTE ON FUNCTION tlog_pending(text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tlog_pending(text, boolean) TO oml_app;
