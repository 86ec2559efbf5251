-- 0030: each chain as a transparency log (issue 23): the tree's nodes in C2SP tlog-tiles form,
-- and the newest signed checkpoint, so that inclusion and consistency proofs are O(log n) reads
-- rather than a rescan of the journal (journal/tlog_store.h).
--
-- merkle_tiles: tile (level, idx) holds the hashes of tree level 8 * level, nodes
--   [256 * idx, 256 * idx + width), 32 bytes each, width = length(hashes) / 32 (1..256). A tile
--   of width 256 is final; a partial one (the right edge) grows as the chain does. Level-0
--   tiles hold the leaf hashes (SHA-256(0x00 || signed_bytes)).
-- tlog_state: per chain, tiled_size (the leaves the tiles cover, seqs 1..tiled_size),
--   verified_size (the largest size whose root, folded from the tiles, was found equal to the
--   commit point's edge in chain_heads: only such a size is signed) and the newest checkpoint
--   signed over them (a C2SP signed note; checkpoint_size its tree size); published_size: the
--   checkpoint size whose tiles, entry bundles and checkpoint were last written to the object
--   store (oml-tlog/<tenant>/...), so a failed put is written again at the next round;
--   signed_by: "<key id> <note key name>" of the checkpoint, so a key rotation or a new
--   tlog_origin re-signs even a chain that does not grow.
-- Both are derived data: built from the journal by `oml serve`'s tlog publisher, never by the
-- commit point. A root is signed only once the tiles' root at that size equals the commit
-- point's edge (tree_edge), and each new checkpoint is checked against the last one signed; a
-- hash changed in a full tile afterwards only makes proofs through it fail against the
-- signed checkpoint.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

CREATE TABLE merkle_tiles (
  tenant_id  uuid     NOT NULL REFERENCES chain_heads(tenant_id),
  level      smallint NOT NULL CHECK (level BETWEEN 0 AND 7),
  idx        bigint   NOT NULL CHECK (idx >= 0),
  hashes     bytea    NOT NULL CHECK (length(hashes) % 32 = 0 AND length(hashes) BETWEEN 32 AND 256 * 32),
  PRIMARY KEY (tenant_id, level, idx)
);

CREATE TABLE tlog_state (
  tenant_id        uuid        PRIMARY KEY REFERENCES chain_heads(tenant_id),
  tiled_size       bigint      NOT NULL CHECK (tiled_size >= 0),
  verified_size    bigint      NOT NULL DEFAULT 0 CHECK (verified_size >= 0 AND verified_size <= tiled_size),
  checkpoint_size  bigint      CHECK (checkpoint_size >= 0 AND checkpoint_size <= verified_size),
  checkpoint       text        CHECK (octet_length(checkpoint) <= 65536),
  published_size   bigint      NOT NULL DEFAULT 0 CHECK (published_size >= 0),
  signed_by        text        CHECK (octet_length(signed_by) <= 512),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT tlog_state_checkpoint_both CHECK ((checkpoint IS NULL) = (checkpoint_size IS NULL))
);

ALTER TABLE merkle_tiles ENABLE ROW LEVEL SECURITY;
CREATE POLICY merkle_tiles_scope ON merkle_tiles
  USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
ALTER TABLE tlog_state ENABLE ROW LEVEL SECURITY;
CREATE POLICY tlog_state_scope ON tlog_state
  USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
GRANT SELECT, INSERT, UPDATE ON merkle_tiles, tlog_state TO oml_app;

-- The chains whose tlog needs work: tiles behind the commit point's edge, a checkpoint behind
-- the verified size, or objects behind the checkpoint. Reveals chain ids only; the publisher
-- then works in each chain's scope (as search_queue_tenants, 0028).
-- p_signer: "<key id> <deployment origin>" of the publisher asking; a checkpoint signed by
-- another (a rotated key, a changed tlog_origin) is work too.
CREATE FUNCTION tlog_pending(p_signer text) RETURNS SETOF uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
  SELECT h.tenant_id FROM oml.chain_heads h LEFT JOIN oml.tlog_state s USING (tenant_id)
   WHERE h.tree_size IS NOT NULL
     AND (s.tenant_id IS NULL OR h.tree_size > s.verified_size
          OR s.checkpoint_size IS DISTINCT FROM s.verified_size OR s.published_size <> s.checkpoint_size
          OR s.signed_by IS DISTINCT FROM p_signer)
$$;
REVOKE EXECUTE ON FUNCTION tlog_pending(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tlog_pending(text) TO oml_app;
