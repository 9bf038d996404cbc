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

-- name: CurveSettings
SELECT seed, realistic, largest, handles FROM populate_settings WHERE id = 1;

-- name: CurveTotals
-- Accounts and records as populated, events in the log, the database's size.
SELECT (SELECT coalesce(sum(count), 0) FROM populate_batches),
       (SELECT coalesce(sum(records), 0) FROM populate_batches),
       (SELECT count(*) FROM events),
       pg_database_size(current_database());

-- name: CurveDIDs
SELECT handle, did FROM accounts WHERE handle = ANY($1::text[]);

-- name: CurveLastSeq
SELECT last_seq FROM sequencer_state WHERE id = 1;

-- name: CurveEventTime
-- The creation time of the first event at or after seq $1.
SELECT created_at FROM events WHERE seq >= $1 AND seq IS NOT NULL ORDER BY seq LIMIT 1;

-- name: CurveEventsBefore
SELECT count(*) FROM events WHERE seq IS NOT NULL AND created_at < $1;

-- name: CurveBlockStats
-- Buffer hits and reads of the database so far.
SELECT blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database();

-- name: CurveActivity
-- The server's backends now: running a statement, and inside a
-- transaction between statements.
SELECT count(*) FILTER (WHERE state = 'active'),
       count(*) FILTER (WHERE state LIKE 'idle in transaction%')
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend';
