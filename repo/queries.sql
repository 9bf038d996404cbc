-- name: LockRoot
SELECT commit_cid, data_cid, rev FROM repo_roots WHERE did = $1 FOR UPDATE;

-- name: HoldLockBriefly
-- First in a commit transaction that holds the repo's row lock across
-- round trips: a writer that freezes (or loses its network) with the lock
-- held loses its session after this long, and the repo's other writers,
-- on every node, go on. The commit itself needs milliseconds between its
-- round trips.
SET LOCAL idle_in_transaction_session_timeout = '5s';

-- name: NoIdleLimit
-- First in an export's read-only transaction: a slow reader (or the
-- export rate) may leave it idle between its queries for long, and it
-- holds no lock anyone waits for.
SET LOCAL idle_in_transaction_session_timeout = 0;

-- name: InsertRoot
INSERT INTO repo_roots (did, commit_cid, commit_data, data_cid, rev)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (did) DO NOTHING;

-- name: GetHead
SELECT commit_cid, commit_data, data_cid, rev FROM repo_roots WHERE did = $1;

-- name: LoadNodes
SELECT cid, data FROM repo_nodes WHERE did = $1;

-- name: GetNode
SELECT data FROM repo_nodes WHERE did = $1 AND cid = $2;

-- name: InsertNodes
INSERT INTO repo_nodes (did, cid, rev, data)
SELECT $1, t.cid, $3, t.data FROM unnest($2::bytea[], $4::bytea[]) AS t(cid, data)
ON CONFLICT (did, cid) DO NOTHING;

-- name: GetRecord
SELECT cid, data FROM records WHERE did = $1 AND collection = $2 AND rkey = $3;

-- name: ListCollections
-- A loose index scan: one index probe per distinct collection, not a scan
-- of every record.
WITH RECURSIVE c AS (
    (SELECT collection FROM records WHERE did = $1 ORDER BY collection LIMIT 1)
    UNION ALL
    SELECT (SELECT r.collection FROM records r
            WHERE r.did = $1 AND r.collection > c.collection
            ORDER BY r.collection LIMIT 1)
    FROM c WHERE c.collection IS NOT NULL
)
SELECT collection FROM c WHERE collection IS NOT NULL;

-- name: ExportNodes
-- In key order, so that every node (and every plan) writes the same bytes
-- for the same commit: a bitmap scan would return heap order.
SELECT cid, data FROM repo_nodes WHERE did = $1 AND ($2 = '' OR rev > $2) ORDER BY cid;

-- name: ExportRecords
SELECT cid, data FROM records WHERE did = $1 AND ($2 = '' OR rev > $2) ORDER BY collection, rkey;

-- name: GetBlockByCID
(SELECT data FROM repo_nodes WHERE did = $1 AND cid = $2)
UNION ALL
(SELECT data FROM records WHERE did = $1 AND cid = $2 LIMIT 1)
LIMIT 1;

-- name: CountRecords
SELECT count(*) FROM records WHERE did = $1;

-- name: DeleteRepoRecords
DELETE FROM records WHERE did = $1;

-- name: DeleteRepoNodes
DELETE FROM repo_nodes WHERE did = $1;

-- name: DeleteRepoRoot
DELETE FROM repo_roots WHERE did = $1;

-- name: Commit
-- A whole commit in one statement: bulwark_commit (migrations/00010), its
-- arguments named as the function declares them. commitParams.args gives
-- them in this order.
SELECT bulwark_commit(
    p_did => $1, p_old => $2, p_commit => $3, p_commit_data => $4, p_data => $5, p_rev => $6,
    p_rm_nodes => $7, p_node_cids => $8, p_node_data => $9,
    p_del_cols => $10, p_del_rkeys => $11,
    p_up_cols => $12, p_up_rkeys => $13, p_up_cids => $14, p_up_data => $15,
    p_ev_kind => $16, p_ev_rev => $17, p_ev_body => $18, p_ev_seq_offset => $19, p_ev_blocks_len => $20, p_ev_ops => $21,
    p_fresh_nodes => $22);

-- name: TryCommit
-- Commit for a writer building on its cached tree: bulwark_try_commit
-- (migrations/00019, 00034) with bulwark_commit's arguments and the rev
-- the cached tree is at. NULL: stored; otherwise nothing was written and the
-- answer is what the cache needs to catch up (see refresh.go).
SELECT bulwark_try_commit(
    p_did => $1, p_old => $2, p_commit => $3, p_commit_data => $4, p_data => $5, p_rev => $6,
    p_rm_nodes => $7, p_node_cids => $8, p_node_data => $9,
    p_del_cols => $10, p_del_rkeys => $11,
    p_up_cols => $12, p_up_rkeys => $13, p_up_cids => $14, p_up_data => $15,
    p_ev_kind => $16, p_ev_rev => $17, p_ev_body => $18, p_ev_seq_offset => $19, p_ev_blocks_len => $20, p_ev_ops => $21,
    p_fresh_nodes => $22, p_old_rev => $23);

-- name: RepoSince
-- NULL while did's root is still at commit $2; otherwise the stored root
-- and the records written after rev $3 (migrations/00034, refresh.go).
SELECT bulwark_repo_since($1, $2, $3);

-- name: RepoNodesSince
-- As RepoSince, with the MST nodes written after rev $3 instead of the
-- records: for when the records do not make the tree (refresh.go).
SELECT bulwark_repo_nodes_since($1, $2, $3);

-- name: GetRev
SELECT rev FROM repo_roots WHERE did = $1;
