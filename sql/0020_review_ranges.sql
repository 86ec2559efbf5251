-- 0020: a reviewer's range reads count as a serve once they cover the file in any order (issue
-- 19, "Review by ranges"). docs/data/postgres-schema.md describes the column.
--
-- review_progress kept only the covered prefix [0, served_upto): reads 0-99, 200-end, 100-199
-- covered every byte but never counted. covered is every byte range read so far (a multirange:
-- adjacent and overlapping ranges merge); served_upto stays the prefix it covers from byte 0, and
-- the file is served when that prefix reaches its size.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

ALTER TABLE review_progress ADD COLUMN covered int8multirange NOT NULL DEFAULT '{}';
UPDATE review_progress SET covered = int8multirange(int8range(0, served_upto)) WHERE served_upto > 0;
