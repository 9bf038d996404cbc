-- +goose Up

-- When the account's current email address was confirmed
-- (com.atproto.server.confirmEmail); NULL while it is not. Changing the
-- address clears it.
ALTER TABLE accounts ADD COLUMN email_confirmed_at timestamptz;

-- +goose Down
ALTER TABLE accounts DROP COLUMN email_confirmed_at;
