-- 0026: the synchronous standbys streaming now, for `oml serve`'s durability monitor and
-- `oml doctor` (issue 21: "it also notices at runtime when the standby set shrinks below the
-- quorum"). synchronous_standby_names says how many standbys a COMMIT waits for; whether that
-- many are connected is only in pg_stat_replication, whose state and sync_state columns other
-- roles see only as members of pg_read_all_stats. oml_app is not one (that role would also show
-- it every session's query text): this function, owned by oml_owner (granted pg_read_all_stats
-- by `oml migrate` when the administrator can), returns two counts and nothing else.
--
-- On a standby, or when oml_owner lacks pg_read_all_stats, the counts are NULL ("unknown"), never
-- a guessed 0.

SET LOCAL search_path = oml, pg_catalog, pg_temp;

CREATE FUNCTION sync_standbys(OUT sync_streaming integer, OUT streaming integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = oml, pg_catalog, pg_temp AS $$
  SELECT CASE WHEN visible THEN s END, CASE WHEN visible THEN n END
  FROM (SELECT pg_catalog.pg_has_role('oml_owner', 'pg_read_all_stats', 'USAGE')
               AND NOT pg_catalog.pg_is_in_recovery() AS visible) v,
       (SELECT (count(*) FILTER (WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')))::integer AS s,
               (count(*) FILTER (WHERE state = 'streaming'))::integer AS n
          FROM pg_catalog.pg_stat_replication) r
$$;
REVOKE ALL ON FUNCTION sync_standbys() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sync_standbys() TO oml_app;
