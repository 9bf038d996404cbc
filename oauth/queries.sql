-- Queries of package oauth (tables from migrations/00013_oauth.sql).

-- name: InsertDevice
INSERT INTO oauth_devices (id, user_agent, expires_at) VALUES ($1, $2, $3);

-- name: TouchDevice
UPDATE oauth_devices SET last_seen_at = now(), expires_at = $2
WHERE id = $1 AND expires_at > now()
RETURNING id;

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
UPDATE oauth_requests SET did = $3, code_hash = $4, expires_at = $5
WHERE id = $1 AND device_id = $2 AND code_hash IS NULL AND expires_at > now()
RETURNING id;

-- name: DeleteRequest
DELETE FROM oauth_requests WHERE id = $1 AND device_id = $2 AND code_hash IS NULL
RETURNING id;

-- name: UseCode
UPDATE oauth_requests SET code_used_at = now()
WHERE code_hash = $1 AND code_used_at IS NULL AND expires_at > now()
RETURNING id, client_id, params, dpop_jkt, client_auth, did;

-- name: SpentCodeGrant
SELECT grant_id FROM oauth_requests WHERE code_hash = $1 AND code_used_at IS NOT NULL;

-- name: SetRequestGrant
UPDATE oauth_requests SET grant_id = $2 WHERE id = $1;

-- name: InsertGrant
INSERT INTO oauth_grants (id, did, client_id, scope, dpop_jkt, client_auth, refresh_hash, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- name: GrantByRefresh
SELECT id, did, client_id, scope, dpop_jkt, client_auth, expires_at, created_at, refreshed_at
FROM oauth_grants
WHERE refresh_hash = $1
FOR UPDATE;

-- name: RotateRefresh
UPDATE oauth_grants SET refresh_hash = $3, expires_at = $4, refreshed_at = now()
WHERE id = $1 AND refresh_hash = $2
RETURNING id;

-- name: InsertSpentRefresh
INSERT INTO oauth_spent_refresh (hash, grant_id, expires_at) VALUES ($1, $2, $3);

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
SELECT did, client_id, scope FROM oauth_grants WHERE id = $1 AND expires_at > now();

-- name: ListGrants
SELECT id, did, client_id, scope, dpop_jkt, client_auth, expires_at, created_at, refreshed_at
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
DELETE FROM oauth_device_accounts WHERE expires_at <= now();

-- name: DeleteExpiredDevices
DELETE FROM oauth_devices WHERE expires_at <= now();

-- name: DeleteGrantsOfDID
DELETE FROM oauth_grants WHERE did = $1;
