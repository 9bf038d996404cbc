-- Read-after-write: what an account wrote after the revision an app view
-- has seen (recent.go).

-- name: GetRev
SELECT rev FROM repo_roots WHERE did = $1;

-- name: PostsSince
-- An account's newest posts written after a revision. TIDs sort as text.
-- records_did_rev (migration 00022) walks the account's records from the
-- newest revision down and stops at the revision: the app view lags by a
-- few records, and the account may have hundreds of thousands.
SELECT rkey, cid, rev, data FROM records
WHERE did = $1 AND rev > $2 AND collection = 'app.bsky.feed.post'
ORDER BY rev DESC, rkey DESC
LIMIT $3;

-- name: ProfileSince
-- An account's current profile record (NULLs when it has none), and
-- whether a revision is the repository's own: at or after its first commit
-- here. No row: no repository here.
SELECT p.cid, p.rev, p.data, COALESCE(r.first_rev <= $2, true)
FROM repo_roots r
LEFT JOIN records p ON p.did = r.did AND p.collection = 'app.bsky.actor.profile' AND p.rkey = 'self'
WHERE r.did = $1;
