-- +goose Up

-- Indexes for lookups that otherwise read a whole table that grows with the
-- server (db/plantest finds them: every named query is planned against a
-- populated database and may not scan such a table).

-- The start-up host check samples the newest active accounts
-- (serverid/queries.sql SampleAccounts), and the admin account search lists
-- newest first: without it, every start sorted every account.
CREATE INDEX accounts_created ON accounts (created_at);

-- Which invite an account was created with (account view, admin lists):
-- the primary key leads with the code.
CREATE INDEX invite_code_uses_used_by ON invite_code_uses (used_by);

-- The OAuth cleanup deletes expired device sign-ins and spent refresh
-- tokens every few minutes (oauth/queries.sql DeleteExpired*).
CREATE INDEX oauth_device_accounts_expires ON oauth_device_accounts (expires_at);
CREATE INDEX oauth_spent_refresh_expires ON oauth_spent_refresh (expires_at);

-- +goose Down
DROP INDEX oauth_spent_refresh_expires;
DROP INDEX oauth_device_accounts_expires;
DROP INDEX invite_code_uses_used_by;
DROP INDEX accounts_created;
