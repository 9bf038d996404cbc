-- Queries of package oauth (tables from migrations/00013_oauth.sql).

-- name: InsertDevice
-- A browser someone just signed in on (under a fresh cookie).
INSERT INTO oauth_devices (id, user_agent, expires_at) VALUES ($1, $2, $3);

-- name: MoveDeviceAccounts
-- The accounts signed in under a browser's old cookie follow it to the
-- new one.
UPDATE oauth_device_accounts SET device_id = $2 WHERE device_id = $1 AND expires_at > now();

-- name: MoveDeviceRequests
UPDATE oauth_requests SET device_id = $2 WHERE device_id = $1 AND code_hash IS NULL;

-- name: DeleteDevice
DELETE FROM oauth_devices WHERE id = $1;

-- name: DeleteDeviceIfUnused
DELETE FROM oauth_devices d
WHERE id = $1
  AND NOT EXISTS (SELECT 1 FROM oauth_device_accounts a WHERE a.device_id = d.id AND a.expires_at > now());

-- name: TrimAccountDevices
-- An account is remembered on its most recent $2 browsers; a browser it
-- was the last account of is forgotten with it.
WITH gone AS (
    DELETE FROM oauth_device_accounts a
    USING (SELECT device_id FROM oauth_device_accounts WHERE did = $1 ORDER BY signed_in_at DESC OFFSET $2) old
    WHERE a.did = $1 AND a.device_id = old.device_id
    RETURNING a.device_id
)
DELETE FROM oauth_devices d
USING gone
WHERE d.id = gone.device_id
  AND NOT EXISTS (SELECT 1 FROM oauth_device_accounts x WHERE x.device_id = d.id AND x.did <> $1 AND x.expires_at > now());

-- name: DeviceAccounts
SELECT did FROM oauth_device_accounts
WHERE device_id = $1 AND expires_at > now()
ORDER BY signed_in_at DESC
LIMIT 20;

-- name: UpsertDeviceAccount
INSERT INTO oauth_device_accounts (device_id, did, expires_at) VALUES ($1, $2, $3)
ON CONFLICT (device_id, did) DO UPDATE SET signed_in_at = now(), expires_at = EXCLUDED.expires_at;

-- name: DeleteDeviceAccount
DELETE FROM oauth_device_accounts WHERE device_id = $1 AND did = $2;

-- name: LockClient
-- Serialises one client's pushed requests, so its cap holds exactly.
SELECT pg_advisory_xact_lock(hashtextextended('bulwark.oauth.client:' || $1, 0));

-- name: CountPending
-- Unapproved requests of client $1 (up to $2) and of all clients (up to
-- $3), expired ones included until they are deleted.
SELECT (SELECT count(*) FROM (SELECT 1 FROM oauth_requests WHERE client_id = $1 AND code_hash IS NULL LIMIT $2) c)::int,
       (SELECT count(*) FROM (SELECT 1 FROM oauth_requests WHERE code_hash IS NULL LIMIT $3) a)::int;

-- name: InsertRequest
INSERT INTO oauth_requests (id, client_id, params, dpop_jkt, client_auth, expires_at)
VALUES ($1, $2, $3, $4, $5, $6);

-- name: GetRequest
SELECT id, client_id, params, dpop_jkt, client_auth, device_id, did, code_hash IS NOT NULL, expires_at
FROM oauth_requests
WHERE id = $1 AND expires_at > now();

-- name: BindRequest
-- The first browser to open a request owns it; opening it again from the
-- same browser extends its life.
UPDATE oauth_requests SET device_id = $2, expires_at = $3
WHERE id = $1 AND expires_at > now() AND code_hash IS NULL
  AND (device_id IS NULL OR device_id = $2)
RETURNING id;

-- name: ApproveRequest
-- $6 is the scope with its permission sets expanded, as the consent page
-- showed them.
UPDATE oauth_requests SET did = $3, code_hash = $4, expires_at = $5, token_scope = $6
WHERE id = $1 AND device_id = $2 AND code_hash IS NULL AND expires_at > now()
RETURNING id;

-- name: DeleteRequest
DELETE FROM oauth_requests WHERE id = $1 AND device_id = $2 AND code_hash IS NULL
RETURNING id;

-- name: UseCode
UPDATE oauth_requests SET code_used_at = now()
WHERE code_hash = $1 AND code_used_at IS NULL AND expires_at > now()
RETURNING id, client_id, params, dpop_jkt, client_auth, did, token_scope;

-- name: SpentCodeGrant
SELECT grant_id FROM oauth_requests WHERE code_hash = $1 AND code_used_at IS NOT NULL;

-- name: SetRequestGrant
UPDATE oauth_requests SET grant_id = $2 WHERE id = $1;

-- name: InsertGrant
INSERT INTO oauth_grants (id, did, client_id, scope, dpop_jkt, client_auth, refresh_hash, expires_at, token_scope)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);

-- name: TrimClientGrants
-- An app keeps its $3 newest grants of an account; older ones end.
DELETE FROM oauth_grants g
USING (SELECT id FROM oauth_grants WHERE did = $1 AND client_id = $2 ORDER BY created_at DESC, id OFFSET $3) old
WHERE g.id = old.id;

-- name: ClientGrantScopes
-- The scopes of the app $2's live grants of the accounts $1.
SELECT did, scope FROM oauth_grants
WHERE did = ANY($1) AND client_id = $2 AND expires_at > now()
ORDER BY created_at DESC
LIMIT $3;

-- name: GrantByRefresh
SELECT id, did, client_id, scope, coalesce(token_scope, scope), dpop_jkt, client_auth, expires_at, created_at, refreshed_at
FROM oauth_grants
WHERE refresh_hash = $1
FOR UPDATE;

-- name: GrantScopes
SELECT id, scope, coalesce(token_scope, scope) FROM oauth_grants WHERE refresh_hash = $1;

-- name: RotateRefresh
UPDATE oauth_grants SET refresh_hash = $3, expires_at = $4, refreshed_at = now(), token_scope = $5
WHERE id = $1 AND refresh_hash = $2
RETURNING id;

-- name: InsertSpentRefresh
INSERT INTO oauth_spent_refresh (hash, grant_id, expires_at) VALUES ($1, $2, $3);

-- name: TrimSpentRefresh
-- A grant remembers its $2 most recently spent refresh tokens.
DELETE FROM oauth_spent_refresh s
USING (SELECT hash FROM oauth_spent_refresh WHERE grant_id = $1 ORDER BY created_at DESC, hash OFFSET $2) old
WHERE s.hash = old.hash;

-- name: SpentRefreshGrant
SELECT grant_id FROM oauth_spent_refresh WHERE hash = $1;

-- name: DeleteGrant
DELETE FROM oauth_grants WHERE id = $1 RETURNING id;

-- name: DeleteGrantOfDID
DELETE FROM oauth_grants WHERE id = $1 AND did = $2 RETURNING id;

-- name: DeleteGrantOfClient
DELETE FROM oauth_grants WHERE id = $1 AND client_id = $2 RETURNING id;

-- name: GrantIDByRefresh
SELECT id FROM oauth_grants WHERE refresh_hash = $1 AND client_id = $2;

-- name: ActiveGrant
SELECT did, client_id, coalesce(token_scope, scope) FROM oauth_grants WHERE id = $1 AND expires_at > now();

-- name: ListGrants
SELECT id, did, client_id, scope, coalesce(token_scope, scope), dpop_jkt, client_auth, expires_at, created_at, refreshed_at
FROM oauth_grants
WHERE did = $1 AND expires_at > now()
ORDER BY created_at DESC
LIMIT $2;

-- name: UseValue
-- A value counts as unused again once its record has expired, even if
-- cleanup has not removed the row yet.
INSERT INTO oauth_used_values (kind, value, expires_at) VALUES ($1, $2, $3)
ON CONFLICT (kind, value) DO UPDATE SET expires_at = EXCLUDED.expires_at
WHERE oauth_used_values.expires_at <= now()
RETURNING kind;

-- name: DeleteExpiredRequests
DELETE FROM oauth_requests WHERE expires_at <= now();

-- name: DeleteExpiredGrants
DELETE FROM oauth_grants WHERE expires_at <= now();

-- name: DeleteExpiredSpentRefresh
DELETE FROM oauth_spent_refresh WHERE expires_at <= now();

-- name: DeleteExpiredValues
DELETE FROM oauth_used_values WHERE expires_at <= now();

-- name: DeleteExpiredDeviceAccounts
-- Lapsed sign-ins, and the browsers they were the last of: a browser is
-- remembered only while an account is signed in on it. (Signing out and
-- trimming forget an emptied browser themselves.) Only the browsers of the
-- deleted rows are probed, never the whole table.
WITH gone AS (
    DELETE FROM oauth_device_accounts WHERE expires_at <= now() RETURNING device_id
)
DELETE FROM oauth_devices d
WHERE d.id = ANY (ARRAY(SELECT DISTINCT device_id FROM gone))
  AND NOT EXISTS (SELECT 1 FROM oauth_device_accounts a WHERE a.device_id = d.id AND a.expires_at > now());

-- name: DeleteExpiredDevices
DELETE FROM oauth_devices WHERE expires_at <= now();

-- name: DeleteGrantsOfDID
DELETE FROM oauth_grants WHERE did = $1;

-- name: TrimValues
-- PKCE challenges and states beyond the newest $1 are forgotten.
DELETE FROM oauth_used_values u
USING (SELECT kind, value FROM oauth_used_values WHERE kind IN ('pkce', 'state') ORDER BY expires_at DESC OFFSET $1) old
WHERE u.kind = old.kind AND u.value = old.value;
