-- +goose Up

-- Autovacuum and statistics for the tables that grow with the server. The
-- defaults wait for a fifth of a table to be dead rows before vacuuming it
-- and a tenth to change before analysing it: on a server of a million
-- accounts that is millions of rows of bloat, and statistics days old.

-- events: every event is written twice (inserted, then numbered by the
-- sequencer) and deleted by retention pruning, so dead rows come at the
-- write rate. Vacuuming at 1% keeps the table the size of the retention
-- window rather than of the history, and keeps the visibility map fresh
-- for the index-only scans that resolve cursors.
ALTER TABLE events SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- records and repo_nodes: a commit replaces the MST nodes on the path to
-- its records and rewrites updated records; deleted accounts and imports
-- leave whole repositories dead.
ALTER TABLE records SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
ALTER TABLE repo_nodes SET (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);

-- +goose Down
ALTER TABLE repo_nodes RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor);
ALTER TABLE records RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor);
ALTER TABLE events RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor);
