-- name: InsertImportedAccount
-- An account moving here from another server: deactivated until the user
-- points the DID here and activates it.
INSERT INTO accounts (did, handle, email, password_hash, signing_key, status)
VALUES ($1, $2, $3, $4, $5, 'deactivated');

-- name: LockMoveState
SELECT status, moved_away_at FROM accounts WHERE did = $1 FOR UPDATE;

-- name: MarkMovedAway
UPDATE accounts SET moved_away_at = $2 WHERE did = $1;

-- name: PruneServiceAuthUsed
DELETE FROM service_auth_used WHERE expires_at < $1;

-- name: InsertServiceAuthUsed
-- No row inserted: the token was used already (a concurrent use waits for
-- the first one's transaction, and finds its row if that commits).
INSERT INTO service_auth_used (purpose, iss, jti, expires_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING;
