-- Queries of the mail flows (email.go) and of password changes, which end
-- every credential of the account.

-- name: LockAccountEmail
SELECT handle, coalesce(email, ''), email_confirmed_at FROM accounts WHERE did = $1 FOR UPDATE;

-- name: ReplaceEmail
-- A new address is not confirmed yet, so sign-in codes, which would go to
-- it, are off until it is confirmed and they are turned on again.
UPDATE accounts SET email = $2, email_confirmed_at = NULL, email_auth_factor = false, updated_at = now()
WHERE did = $1;

-- name: SetEmailAuthFactor
UPDATE accounts SET email_auth_factor = $2, updated_at = now() WHERE did = $1;

-- name: ConfirmEmail
UPDATE accounts SET email_confirmed_at = $2, updated_at = now() WHERE did = $1;

-- name: DeleteAllAppPasswords
DELETE FROM app_passwords WHERE did = $1;
