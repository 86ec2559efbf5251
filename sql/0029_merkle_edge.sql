-- 0029: every chain is also an RFC 9162 Merkle tree (issue 23) whose entries are the events'
-- signed_bytes in seq order (leaf i = the event at seq i + 1). The commit point keeps the tree's
-- right edge beside the head, in the same transaction as the append, so the root of the tree
-- at the head is known without a rescan (src/merkle/merkle.h CompactRange):
--   tree_size  the leaves the edge covers: the head's seq once the tree is kept, less while a
--              writer of the previous version appended (the next append catches up from the
--              journal), NULL until the chain's tree is built (chains that existed before 0029:
--              `oml serve` builds them from the journal at start, journal::BuildMissingTrees)
--   tree_edge  the roots of the tree's perfect subtrees, largest first, 32 bytes each
--              (popcount(tree_size) of them)
-- Nothing existing is rewritten: the chain, its hashes and signatures stay as they are.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

ALTER TABLE chain_heads
  ADD COLUMN tree_size bigint CONSTRAINT chain_heads_tree_size CHECK (tree_size >= 0),
  ADD COLUMN tree_edge bytea CONSTRAINT chain_heads_tree_edge CHECK (length(tree_edge) % 32 = 0 AND length(tree_edge) <= 64 * 32),
  ADD CONSTRAINT chain_heads_tree_both CHECK ((tree_size IS NULL) = (tree_edge IS NULL));

-- The append's head update and its edge in one statement (one row version per append, as
-- before 0029): advance_head as in 0003, and the edge when p_tree_edge is not NULL (NULL
-- leaves the tree columns as they are: a chain whose tree is not built yet). The 5-argument
-- advance_head stays for writers of the previous version and the lake's dead-letter commit;
-- what they append without the edge, the next append catches up from the journal.
CREATE FUNCTION advance_head(p_tenant uuid, p_from bigint, p_to bigint, p_hash bytea, p_time text,
                             p_tree_size bigint, p_tree_edge bytea) RETURNS void
LANGUAGE plpgsql SET search_path = oml, pg_catalog, pg_temp AS $$
BEGIN
  IF p_to <= p_from THEN
    RAISE EXCEPTION 'head must move forward (% -> %)', p_from, p_to USING ERRCODE = 'data_exception';
  END IF;
  IF p_tree_edge IS NOT NULL AND p_tree_size IS DISTINCT FROM p_to THEN
    RAISE EXCEPTION 'the Merkle edge must cover the new head (% leaves, head %)', p_tree_size, p_to
      USING ERRCODE = 'data_exception';
  END IF;
  IF p_from = 0 THEN
    INSERT INTO oml.chain_heads (tenant_id, seq, event_hash, event_time, tree_size, tree_edge)
      VALUES (p_tenant, p_to, p_hash, p_time, p_tree_size, p_tree_edge);
    RETURN;
  END IF;
  UPDATE oml.chain_heads SET seq = p_to, event_hash = p_hash, event_time = p_time, updated_at = now(),
         tree_size = CASE WHEN p_tree_edge IS NULL THEN tree_size ELSE p_tree_size END,
         tree_edge = coalesce(p_tree_edge, tree_edge)
   WHERE tenant_id = p_tenant AND seq = p_from;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'chain head of % is not at seq %', p_tenant, p_from USING ERRCODE = 'serialization_failure';
  END IF;
END $$;
REVOKE EXECUTE ON FUNCTION advance_head(uuid, bigint, bigint, bytea, text, bigint, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION advance_head(uuid, bigint, bigint, bytea, text, bigint, bytea) TO oml_app;
