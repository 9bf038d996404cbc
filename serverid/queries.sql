-- Statements on the recorded host of a database (server_identity).

-- name: RecordedHost
SELECT hostname, public_url FROM server_identity WHERE id = 1;

-- name: RecordHost
INSERT INTO server_identity (id, hostname, public_url) VALUES (1, $1, $2)
ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname, public_url = excluded.public_url, recorded_at = now();

-- name: HasAccounts
SELECT EXISTS (SELECT 1 FROM accounts);

-- name: SampleAccounts
-- The newest active accounts: those most likely made by the server as it
-- is configured now (an account migrating in is not active yet).
SELECT did FROM accounts WHERE status = 'active' ORDER BY created_at DESC LIMIT $1;

-- name: HostsHandle
-- Whether an active account has this handle (lower case), as
-- /.well-known/atproto-did answers for: one lookup in the handle's
-- unique index.
SELECT EXISTS (SELECT 1 FROM accounts WHERE handle = $1 AND status = 'active');
