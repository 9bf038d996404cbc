-- name: InsertSession
INSERT INTO console_sessions (id, expires_at) VALUES ($1, $2);

-- name: SessionLive
SELECT EXISTS (SELECT 1 FROM console_sessions WHERE id = $1 AND expires_at > $2);

-- name: DeleteSession
DELETE FROM console_sessions WHERE id = $1;

-- name: DeleteExpiredSessions
DELETE FROM console_sessions WHERE expires_at <= $1;
