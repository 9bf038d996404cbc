-- name: InsertImportedAccount
-- An account moving here from another server: deactivated until the user
-- points the DID here and activates it.
INSERT INTO accounts (did, handle, email, password_hash, signing_key, status)
VALUES ($1, $2, $3, $4, $5, 'deactivated');
