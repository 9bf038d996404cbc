-- name: ListRepos
-- Hosted repositories in DID order after cursor $1, with the account status
-- when the account still exists (NULL: no account row; listed as deleted
-- when the server has accounts). The status is one primary-key probe per
-- row listed: joined instead, the planner merges with every account before
-- the cursor, and a walk of the whole server takes time quadratic in its
-- accounts (6 s a page half way through a million).
SELECT r.did, r.commit_cid, r.rev, (SELECT a.status FROM accounts a WHERE a.did = r.did)
FROM repo_roots r
WHERE r.did > $1
ORDER BY r.did
LIMIT $2;
