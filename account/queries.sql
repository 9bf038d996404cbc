-- name: InsertAccount
INSERT INTO accounts (did, handle, email, password_hash, signing_key)
VALUES ($1, $2, $3, $4, $5);

-- name: HandleOrEmailTaken
-- $3 is a DID whose own account does not count ('' for none).
SELECT
    EXISTS (SELECT 1 FROM accounts WHERE handle = $1 AND did <> $3),
    EXISTS (SELECT 1 FROM accounts WHERE email = $2 AND did <> $3);

-- name: GetAccountByDID
SELECT did, handle, coalesce(email, ''), status, invites_disabled, created_at, password_hash, email_confirmed_at, email_auth_factor
FROM accounts WHERE did = $1;

-- name: GetAccountByHandle
SELECT did, handle, coalesce(email, ''), status, invites_disabled, created_at, password_hash, email_confirmed_at, email_auth_factor
FROM accounts WHERE handle = $1;

-- name: GetAccountByEmail
SELECT did, handle, coalesce(email, ''), status, invites_disabled, created_at, password_hash, email_confirmed_at, email_auth_factor
FROM accounts WHERE email = $1;

-- name: LockAccount
SELECT handle, status, password_hash FROM accounts WHERE did = $1 FOR UPDATE;

-- name: GetSigningKey
SELECT signing_key FROM accounts WHERE did = $1;

-- name: SetStatus
-- Activation clears the moved-away mark (migrate.sql, MarkMovedAway).
UPDATE accounts
SET status = $2, updated_at = now(),
    moved_away_at = CASE WHEN $2::text = 'active' THEN NULL ELSE moved_away_at END
WHERE did = $1;

-- name: SetHandle
UPDATE accounts SET handle = $2, updated_at = now() WHERE did = $1;

-- name: SetPassword
UPDATE accounts SET password_hash = $2, updated_at = now() WHERE did = $1;

-- name: DeleteAccount
DELETE FROM accounts WHERE did = $1;

-- name: CheckSession
-- One round trip per authenticated request: the account's state and whether
-- the session the access token belongs to is still alive.
SELECT a.handle, a.status,
       EXISTS (SELECT 1 FROM refresh_tokens r
               WHERE r.session_id = $2 AND r.did = a.did AND r.expires_at > now())
FROM accounts a WHERE a.did = $1;

-- name: CheckSessionGuard
-- CheckSession inside a commit: raises SQLSTATE BW002 (through
-- bulwark_refuse_session, migrations/00009) instead of answering. CASE
-- evaluates the refusal only when the check fails.
SELECT CASE WHEN EXISTS (
           SELECT 1 FROM accounts a JOIN refresh_tokens r ON r.did = a.did
           WHERE a.did = $1 AND a.status = 'active' AND r.session_id = $2 AND r.expires_at > now())
       THEN true ELSE bulwark_refuse_session($1) END;

-- name: InsertRefreshToken
INSERT INTO refresh_tokens (jti, session_id, did, app_password_name, expires_at)
VALUES ($1, $2, $3, $4, $5);

-- name: InsertTakendownSession
-- A taken-down account's session (ScopeTakendown): it lives as long as its
-- access token ($4) and is never refreshed.
INSERT INTO refresh_tokens (jti, session_id, did, expires_at, takendown)
VALUES ($1, $2, $3, $4, true);

-- name: LockRefreshToken
SELECT r.session_id, r.app_password_name,
       coalesce((SELECT p.privileged FROM app_passwords p
                 WHERE p.did = r.did AND p.name = r.app_password_name), false),
       r.next_jti, r.takendown
FROM refresh_tokens r
WHERE r.jti = $1 AND r.did = $2 AND r.expires_at > now()
FOR UPDATE;

-- name: RotateRefreshToken
-- The exchanged token lives on only for the grace period ($3).
UPDATE refresh_tokens SET next_jti = $2, expires_at = least(expires_at, $3)
WHERE jti = $1;

-- name: RefreshTokenExpiry
SELECT expires_at FROM refresh_tokens WHERE jti = $1 AND expires_at > now();

-- name: DeleteRefreshToken
DELETE FROM refresh_tokens WHERE jti = $1 AND did = $2;

-- name: DeleteSession
DELETE FROM refresh_tokens WHERE session_id = $1 AND did = $2;

-- name: DeleteAllSessions
DELETE FROM refresh_tokens WHERE did = $1;

-- name: DeleteExpiredRefreshTokens
DELETE FROM refresh_tokens WHERE did = $1 AND expires_at <= now();

-- name: InsertAppPassword
INSERT INTO app_passwords (did, name, password_hash, privileged)
VALUES ($1, $2, $3, $4)
RETURNING created_at;

-- name: CountAppPasswords
SELECT count(*) FROM app_passwords WHERE did = $1;

-- name: FindAppPassword
SELECT name, privileged FROM app_passwords WHERE did = $1 AND password_hash = $2;

-- name: ListAppPasswords
SELECT name, privileged, created_at FROM app_passwords WHERE did = $1 ORDER BY created_at DESC, name;

-- name: DeleteAppPassword
DELETE FROM app_passwords WHERE did = $1 AND name = $2;

-- name: DeleteAppPasswordSessions
DELETE FROM refresh_tokens WHERE did = $1 AND app_password_name = $2;

-- name: InsertInviteCode
INSERT INTO invite_codes (code, available, for_account, created_by)
VALUES ($1, $2, $3, $4);

-- name: UseInviteCode
UPDATE invite_codes SET available = available - 1
WHERE code = $1 AND available > 0 AND NOT disabled
RETURNING for_account;

-- name: InsertInviteUse
INSERT INTO invite_code_uses (code, used_by) VALUES ($1, $2);

-- name: ListInviteCodesFor
SELECT c.code, c.available, c.disabled, c.for_account, c.created_by, c.created_at,
       coalesce(array_agg(u.used_by ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}'),
       coalesce(array_agg(u.used_at ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}')
FROM invite_codes c
LEFT JOIN invite_code_uses u ON u.code = c.code
WHERE c.for_account = $1
GROUP BY c.code
ORDER BY c.created_at, c.code;

-- name: SessionOfRefreshToken
SELECT session_id FROM refresh_tokens WHERE jti = $1 AND did = $2;

-- name: LockRepoRoot
-- Taken before deleting a repository, in the order writers take it.
SELECT 1 FROM repo_roots WHERE did = $1 FOR UPDATE;

-- name: SetInvitesDisabled
UPDATE accounts SET invites_disabled = $2, updated_at = now() WHERE did = $1;

-- name: GetAccountsByDID
SELECT did, handle, coalesce(email, ''), status, invites_disabled, created_at, password_hash, email_confirmed_at, email_auth_factor
FROM accounts WHERE did = ANY($1::text[]) ORDER BY did;

-- name: InviteUsedBy
SELECT code FROM invite_code_uses WHERE used_by = $1 LIMIT 1;

-- name: ListInviteCodes
-- Newest first; the cursor is the last code of the previous page's
-- (created_at, code).
SELECT c.code, c.available, c.disabled, c.for_account, c.created_by, c.created_at,
       coalesce(array_agg(u.used_by ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}'),
       coalesce(array_agg(u.used_at ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}')
FROM invite_codes c
LEFT JOIN invite_code_uses u ON u.code = c.code
WHERE $1 = '' OR (c.created_at, c.code) < (SELECT created_at, code FROM invite_codes WHERE code = $1)
GROUP BY c.code
ORDER BY c.created_at DESC, c.code DESC
LIMIT $2;

-- name: DisableInviteCodes
UPDATE invite_codes SET disabled = true
WHERE (code = ANY($1::text[]) OR for_account = ANY($2::text[])) AND NOT disabled
RETURNING code;

-- name: CountCredentials
-- What a password change ends: live sessions and app passwords.
SELECT (SELECT count(DISTINCT session_id) FROM refresh_tokens WHERE did = $1 AND expires_at > now()),
       (SELECT count(*) FROM app_passwords WHERE did = $1);
