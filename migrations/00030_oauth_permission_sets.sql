-- +goose Up

-- OAuth permission sets (include: scopes). A grant keeps the scope the
-- person allowed as the app asked for it (scope, include: values as
-- written) and what that scope grants with each set expanded
-- (token_scope): what its access tokens may do and what the token
-- endpoint answers. A request holds the expansion the person saw on the
-- consent page from approval until its code is exchanged. NULL (rows
-- from before permission sets): the same as scope.
ALTER TABLE oauth_requests ADD COLUMN token_scope text;
ALTER TABLE oauth_grants ADD COLUMN token_scope text;

-- Silent re-authorization (prompt=none) looks up an app's live grants
-- for the accounts signed in on a browser; an app keeps a bounded number
-- of grants per account.
CREATE INDEX oauth_grants_did_client ON oauth_grants (did, client_id, created_at);

-- +goose Down
DROP INDEX oauth_grants_did_client;
ALTER TABLE oauth_grants DROP COLUMN token_scope;
ALTER TABLE oauth_requests DROP COLUMN token_scope;
