-- name: CountBlocks
-- Blocks of the repository's current state: MST nodes, distinct record
-- blocks, and the commit.
SELECT (SELECT count(*) FROM repo_nodes WHERE did = $1)
     + (SELECT count(DISTINCT cid) FROM records WHERE did = $1)
     + (SELECT count(*) FROM repo_roots WHERE did = $1);
