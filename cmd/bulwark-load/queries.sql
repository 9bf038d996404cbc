-- Statements bulwark-load runs on a server's database directly (populate,
-- curve): bookkeeping and sizes, never the server's own work.

-- name: VacuumAnalyze
VACUUM (ANALYZE);

-- name: PopulatedHistory
SELECT coalesce((SELECT history FROM populate_settings WHERE id = 1), 0);

-- name: TableSizes
-- The database, then its largest tables: total, heap, TOAST and index
-- bytes, and the planner's row count.
SELECT 'database', pg_database_size(current_database()), 0::bigint, 0::bigint, 0::bigint, 0::bigint
UNION ALL
(SELECT c.relname::text, pg_total_relation_size(c.oid), pg_relation_size(c.oid),
        coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), pg_indexes_size(c.oid),
        greatest(c.reltuples, 0)::bigint
 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public' AND c.relkind = 'r'
 ORDER BY pg_total_relation_size(c.oid) DESC
 LIMIT 16);
