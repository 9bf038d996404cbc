-- +goose Up

-- Operator console sessions: a row per login, deleted at logout, so that a
-- copied cookie dies with the logout on every node and across restarts.
-- id is the SHA-256 of the session id the (signed) cookie carries.
CREATE TABLE console_sessions (
    id         bytea       PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_expires ON console_sessions (expires_at);

-- +goose Down
DROP TABLE console_sessions;
