-- Queries of the mail flows (email.go) and of password changes, which end
-- every credential of the account.

-- name: LockAccountEmail
SELECT handle, coalesce(email, ''), email_confirmed_at FROM accounts WHERE did = $1 FOR UPDATE;

-- name: ReplaceEmail
-- A new address is not confirmed yet.
UPDATE accounts SET email = $2, email_confirmed_at = NULL, updated_at = now() WHERE did = $1;

-- name: ConfirmEmail
UPDATE accounts SET email_confirmed_at = $2, updated_at = now() WHERE did = $1;

-- name: DeleteAllAppPasswords
DELETE FROM app_passwords WHERE did = $1;
