-- +goose Up

-- One row per hosted account. The handle is stored lower case (handles are
-- case-insensitive); email likewise. The signing key is the account's K-256
-- repository key, AES-256-GCM encrypted with a key derived from the server's
-- PLC rotation key (see account/keys.go), the DID as associated data.
CREATE TABLE accounts (
    did             text        PRIMARY KEY,
    handle          text        NOT NULL UNIQUE,
    email           text        UNIQUE,
    password_hash   text        NOT NULL, -- PHC-format argon2id
    signing_key     bytea       NOT NULL,
    status          text        NOT NULL DEFAULT 'active'
                    CHECK (status IN ('active', 'deactivated', 'takendown')),
    invites_disabled boolean    NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- A session is a chain of refresh tokens: refreshing replaces the row's jti
-- and keeps session_id, so the access tokens of a session (which carry
-- session_id) die with it on deleteSession, app-password revocation or
-- account deletion.
CREATE TABLE refresh_tokens (
    jti               text        PRIMARY KEY,
    session_id        text        NOT NULL,
    did               text        NOT NULL REFERENCES accounts (did) ON DELETE CASCADE,
    app_password_name text,
    expires_at        timestamptz NOT NULL,
    -- Set once the token has been exchanged: a client that presents it
    -- again within the grace period (a retried or concurrent refresh) gets
    -- the same successor instead of losing its session, as with the
    -- reference PDS.
    next_jti          text,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX refresh_tokens_session ON refresh_tokens (session_id);
CREATE INDEX refresh_tokens_did ON refresh_tokens (did, app_password_name);

-- App passwords are hashed deterministically (argon2id salted with the DID)
-- so that a login is one hash and one lookup however many an account has.
CREATE TABLE app_passwords (
    did           text        NOT NULL REFERENCES accounts (did) ON DELETE CASCADE,
    name          text        NOT NULL,
    password_hash bytea       NOT NULL,
    privileged    boolean     NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (did, name)
);
CREATE UNIQUE INDEX app_passwords_hash ON app_passwords (did, password_hash);

-- Invite codes. for_account is the DID the code was made for, or 'admin'.
CREATE TABLE invite_codes (
    code        text        PRIMARY KEY,
    available   integer     NOT NULL CHECK (available >= 0),
    disabled    boolean     NOT NULL DEFAULT false,
    for_account text        NOT NULL,
    created_by  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX invite_codes_for_account ON invite_codes (for_account);

CREATE TABLE invite_code_uses (
    code    text        NOT NULL REFERENCES invite_codes (code) ON DELETE CASCADE,
    used_by text        NOT NULL,
    used_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (code, used_by)
);

-- +goose Down
DROP TABLE invite_code_uses;
DROP TABLE invite_codes;
DROP TABLE app_passwords;
DROP TABLE refresh_tokens;
DROP TABLE accounts;
