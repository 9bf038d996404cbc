-- name: ListRepos
-- Hosted repositories in DID order after cursor $1, with the account status
-- when the account still exists (NULL: no account row; listed as deleted
-- when the server has accounts).
SELECT r.did, r.commit_cid, r.rev, a.status
FROM repo_roots r LEFT JOIN accounts a ON a.did = r.did
WHERE r.did > $1
ORDER BY r.did
LIMIT $2;
