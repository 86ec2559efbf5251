-- 0022: shorter life for shredded keys (issue 19, "Crypto-shredding residue").
--
-- An erasure deletes an artifact_keys / attachment_keys row, and an ended upload session sets
-- its wrapped_dek to NULL; under MVCC both leave the old row version, wrapped DEK included, in the
-- table's heap file until VACUUM prunes it (and its bytes in the page's free space until a later
-- row overwrites them). With the KEK, such a DEK still opens a copy of the object taken before
-- the erasure. Autovacuum normally waits for 50 dead rows plus 20% of the table: on these three
-- tables it now runs after the first dead row (at most autovacuum_naptime later, 1 min by
-- default), TOAST tables included. `oml kek purge-residue` (VACUUM FULL: new files without the
-- dead versions) removes the rest on demand; WAL and backups are bounded by their retention
-- (docs/data/event-catalog.md, "What an erasure leaves").

SET LOCAL search_path = oml, pg_catalog, pg_temp;

ALTER TABLE artifact_keys SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,
                               toast.autovacuum_vacuum_threshold = 0, toast.autovacuum_vacuum_scale_factor = 0);
ALTER TABLE attachment_keys SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,
                                 toast.autovacuum_vacuum_threshold = 0, toast.autovacuum_vacuum_scale_factor = 0);
ALTER TABLE upload_sessions SET (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,
                                 toast.autovacuum_vacuum_threshold = 0, toast.autovacuum_vacuum_scale_factor = 0);
