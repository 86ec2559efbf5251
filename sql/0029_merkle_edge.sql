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
