-- Repository import (import.go, import_stage.go). The CAR is staged in
-- temporary tables of the import's own database session, filled while it
-- streams in and dropped at the end whatever happens (with the session, if
-- it comes to that): a failed import leaves nothing behind, and a crash
-- nothing to sweep. Only the final replacement of the repository runs in a
-- transaction, after the whole CAR has arrived.

-- name: ImportDropStaging
DROP TABLE IF EXISTS import_blocks, import_nodes, import_entries;

-- name: ImportCreateBlocks
-- Every block of the CAR, copied in chunks as it streams in. No key while
-- it loads: a CAR may repeat a block, and the index is built once, at the
-- end.
CREATE TEMP TABLE import_blocks (cid bytea NOT NULL, data bytea NOT NULL);

-- name: ImportCreateNodes
-- The MST nodes reached from the commit's data root.
CREATE TEMP TABLE import_nodes (cid bytea PRIMARY KEY);

-- name: ImportCreateEntries
-- The records the tree names, by path.
CREATE TEMP TABLE import_entries (
    path       text  PRIMARY KEY,
    collection text  NOT NULL,
    rkey       text  NOT NULL,
    cid        bytea NOT NULL
);

-- name: ImportSettings
-- First in the import's transaction. The final INSERT ... SELECTs cross
-- the planner's JIT cost thresholds for a large repository, and compiling
-- them costs more than it saves on plans that are index lookups.
SET LOCAL jit = off;

-- name: ImportIndexBlocks
CREATE INDEX import_blocks_cid ON import_blocks (cid);

-- name: ImportAnalyzeBlocks
-- Temporary tables are never analysed by autovacuum; without statistics
-- the batched lookups below are planned as scans of the whole table.
ANALYZE import_blocks;

-- name: ImportAnalyzeTree
ANALYZE import_nodes, import_entries;

-- name: ImportNodeBatch
-- The requested blocks, each once, in CID order; past the one that brings
-- their bytes to $2 the data is left out (NULL), so a batch of unusually
-- large nodes cannot take unbounded memory: the walk asks for those again.
-- A CID with no row at all is not in the CAR.
SELECT cid, CASE WHEN running - length(data) < $2 THEN data END
FROM (
    SELECT cid, data, sum(length(data)) OVER (ORDER BY cid) AS running
    FROM (SELECT DISTINCT ON (cid) cid, data FROM import_blocks
          WHERE cid = ANY($1::bytea[]) ORDER BY cid) d
) t
ORDER BY cid;

-- name: ImportAddNodes
-- A node met twice is a unique violation: the import is refused.
INSERT INTO import_nodes (cid) SELECT unnest($1::bytea[]);

-- name: ImportAddEntries
INSERT INTO import_entries (path, collection, rkey, cid)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]);

-- name: ImportRecordPage
-- The records after path $1, in path order: at most $2 of them, and none
-- past the one that brings their bytes to $3 (always at least one). data
-- is NULL for a record whose block is not in the CAR.
SELECT path, cid, data FROM (
    SELECT e.path, e.cid, length(b.data) AS size, b.data,
           sum(length(b.data)) OVER (ORDER BY e.path) AS running
    FROM (SELECT * FROM import_entries WHERE path > $1 ORDER BY path LIMIT $2) e
    LEFT JOIN LATERAL (SELECT data FROM import_blocks WHERE cid = e.cid LIMIT 1) b ON true
) t
WHERE coalesce(running - size, running, 0) < $3
ORDER BY path;

-- name: ImportDeleteRecords
DELETE FROM records WHERE did = $1;

-- name: ImportDeleteNodes
DELETE FROM repo_nodes WHERE did = $1;

-- name: ImportInsertNodes
INSERT INTO repo_nodes (did, cid, rev, data)
SELECT $1, n.cid, $2, b.data
FROM import_nodes n
JOIN LATERAL (SELECT data FROM import_blocks WHERE cid = n.cid LIMIT 1) b ON true;

-- name: ImportInsertRecords
INSERT INTO records (did, collection, rkey, cid, rev, data)
SELECT $1, e.collection, e.rkey, e.cid, $2, b.data
FROM import_entries e
JOIN LATERAL (SELECT data FROM import_blocks WHERE cid = e.cid LIMIT 1) b ON true;

-- name: ImportSetRoot
UPDATE repo_roots
SET commit_cid = $2, commit_data = $3, data_cid = $4, rev = $5, updated_at = now()
WHERE did = $1;
