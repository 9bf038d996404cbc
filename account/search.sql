-- name: CountAccountsByStatus
SELECT status, count(*) FROM accounts GROUP BY status;

-- name: SearchAccounts
-- $1 an exact DID or '', $2 a LIKE pattern on handle and email or '',
-- $3 a status or ''. Newest first.
SELECT did, handle, coalesce(email, ''), status, invites_disabled, created_at, password_hash, email_confirmed_at, email_auth_factor
FROM accounts
WHERE ($1 = '' OR did = $1 OR handle LIKE $2 ESCAPE '\' OR email LIKE $2 ESCAPE '\')
  AND ($3 = '' OR status = $3)
ORDER BY created_at DESC, did
LIMIT $4;
