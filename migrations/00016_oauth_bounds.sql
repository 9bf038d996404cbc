-- +goose Up

-- A browser is bound to the authorization request it opened by the hash of
-- its cookie, before anyone has signed in on it, while oauth_devices holds
-- only browsers someone signed in on: oauth_requests.device_id names a
-- browser, which may have no row.
ALTER TABLE oauth_requests DROP CONSTRAINT oauth_requests_device_id_fkey;

-- Pending requests are counted per client at every pushed request (the
-- per-client cap).
CREATE INDEX oauth_requests_pending_client ON oauth_requests (client_id) WHERE code_hash IS NULL;

-- A grant remembers only its most recently spent refresh tokens.
ALTER TABLE oauth_spent_refresh ADD COLUMN created_at timestamptz NOT NULL DEFAULT now();

-- Browsers that only ever opened a page, and remembered browsers with no
-- account signed in, are not kept; the rest live as long as a sign-in.
DELETE FROM oauth_devices d
WHERE NOT EXISTS (SELECT 1 FROM oauth_device_accounts a WHERE a.device_id = d.id AND a.expires_at > now());
UPDATE oauth_devices d SET expires_at = a.expires_at
FROM (SELECT device_id, max(expires_at) AS expires_at FROM oauth_device_accounts GROUP BY device_id) a
WHERE a.device_id = d.id;

-- +goose Down
ALTER TABLE oauth_spent_refresh DROP COLUMN created_at;
DROP INDEX oauth_requests_pending_client;
UPDATE oauth_requests r SET device_id = NULL
WHERE device_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM oauth_devices d WHERE d.id = r.device_id);
ALTER TABLE oauth_requests ADD CONSTRAINT oauth_requests_device_id_fkey
    FOREIGN KEY (device_id) REFERENCES oauth_devices (id) ON DELETE CASCADE;
