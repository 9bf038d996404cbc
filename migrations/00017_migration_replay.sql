-- +goose Up

-- Service-auth JWTs this server has accepted, so that each works once:
-- keyed by what it was accepted for (its lxm), its issuer and its jti, and
-- kept until it expires (accepted tokens live at most an hour). A row is
-- written in the transaction of the request the token authorised, so a
-- refused request leaves none.
CREATE TABLE service_auth_used (
    purpose    text        NOT NULL,
    iss        text        NOT NULL,
    jti        text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (purpose, iss, jti)
);
CREATE INDEX service_auth_used_expires ON service_auth_used (expires_at);

-- When the account was deactivated by its owner, from active, while its
-- DID document named another server: it moved away, and a later
-- createAccount bringing the DID back may replace it. NULL for every other
-- account, notably one created here for a move still in progress.
-- Activation clears it.
ALTER TABLE accounts ADD COLUMN moved_away_at timestamptz;

-- +goose Down
ALTER TABLE accounts DROP COLUMN moved_away_at;
DROP TABLE service_auth_used;
