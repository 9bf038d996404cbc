-- +goose Up

-- Service-auth tokens (JWTs an account's server signs for another
-- service) that were used here, remembered until they expire so that one
-- is accepted once (package replay). Rows live at most as long as the
-- longest token accepted (an hour) and are pruned as new ones arrive.
CREATE TABLE spent_service_tokens (
    issuer     text        NOT NULL, -- the token's iss (a DID)
    token_id   text        NOT NULL, -- its jti
    expires_at timestamptz NOT NULL, -- its exp, plus the clock leeway
    PRIMARY KEY (issuer, token_id)
);
CREATE INDEX spent_service_tokens_expires_at ON spent_service_tokens (expires_at);

-- +goose Down
DROP TABLE spent_service_tokens;
