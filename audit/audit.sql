-- name: Insert
INSERT INTO audit_log (actor, action, subject, before, after, reason)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id, at;

-- name: List
SELECT id, at, actor, action, subject, before, after, reason
FROM audit_log
WHERE ($1 = '' OR subject = $1) AND ($2::bigint = 0 OR id < $2)
ORDER BY id DESC
LIMIT $3;
