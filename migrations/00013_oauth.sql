-- +goose Up

-- OAuth authorization server state (package oauth). Every secret a client
-- or browser holds (authorization codes, refresh tokens, device cookies) is
-- stored only as its SHA-256 hash.

-- Browsers that have opened the sign-in pages. The cookie holds a random
-- secret; id is its hash.
CREATE TABLE oauth_devices (
    id           bytea       PRIMARY KEY,
    user_agent   text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX oauth_devices_expires ON oauth_devices (expires_at);

-- Accounts signed in on a device (several may be, for choosing).
CREATE TABLE oauth_device_accounts (
    device_id    bytea       NOT NULL REFERENCES oauth_devices (id) ON DELETE CASCADE,
    did          text        NOT NULL REFERENCES accounts (did) ON DELETE CASCADE,
    signed_in_at timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (device_id, did)
);
CREATE INDEX oauth_device_accounts_did ON oauth_device_accounts (did);

-- Pushed authorization requests, from PAR to the code exchange. The first
-- browser to open a request owns it (device_id); approval fills in did and
-- code_hash; the token endpoint marks the code used and keeps the row until
-- it expires, so that a second use of the code can revoke what the first
-- one produced (grant_id).
CREATE TABLE oauth_requests (
    id           text        PRIMARY KEY,
    client_id    text        NOT NULL,
    params       jsonb       NOT NULL,
    dpop_jkt     text        NOT NULL,
    client_auth  jsonb       NOT NULL,
    device_id    bytea       REFERENCES oauth_devices (id) ON DELETE CASCADE,
    did          text        REFERENCES accounts (did) ON DELETE CASCADE,
    code_hash    bytea       UNIQUE,
    code_used_at timestamptz,
    grant_id     text,
    expires_at   timestamptz NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX oauth_requests_expires ON oauth_requests (expires_at);

-- Grants ("OAuth sessions"): one per approved authorization, living on
-- through refresh-token rotation until revoked or expired. Access tokens
-- carry the grant id and are refused once the row is gone.
CREATE TABLE oauth_grants (
    id                 text        PRIMARY KEY,
    did                text        NOT NULL REFERENCES accounts (did) ON DELETE CASCADE,
    client_id          text        NOT NULL,
    scope              text        NOT NULL,
    dpop_jkt           text        NOT NULL,
    client_auth        jsonb       NOT NULL,
    refresh_hash       bytea       NOT NULL UNIQUE,
    -- When the current refresh token stops working, which ends the grant:
    -- moved forward on each refresh, up to the client's session limit.
    expires_at         timestamptz NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    refreshed_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX oauth_grants_did ON oauth_grants (did, created_at);
CREATE INDEX oauth_grants_expires ON oauth_grants (expires_at);

-- Refresh tokens already exchanged. Presenting one again means it was
-- stolen or the client is confused: the whole grant is revoked.
CREATE TABLE oauth_spent_refresh (
    hash       bytea       PRIMARY KEY,
    grant_id   text        NOT NULL REFERENCES oauth_grants (id) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL
);
CREATE INDEX oauth_spent_refresh_grant ON oauth_spent_refresh (grant_id);

-- Values a client may use only once for a while: client-assertion ids,
-- PKCE challenges, request states. value is a hash.
CREATE TABLE oauth_used_values (
    kind       text        NOT NULL,
    value      bytea       NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (kind, value)
);
CREATE INDEX oauth_used_values_expires ON oauth_used_values (expires_at);

-- +goose Down
DROP TABLE oauth_used_values;
DROP TABLE oauth_spent_refresh;
DROP TABLE oauth_grants;
DROP TABLE oauth_requests;
DROP TABLE oauth_device_accounts;
DROP TABLE oauth_devices;
