// Package account owns Bulwark's accounts: creation (with a did:plc made by
// package plc and the empty repository made by package repo, in one
// transaction), passwords (argon2id), per-account signing keys (encrypted at
// rest, see KeyStore), sessions (HS256 JWTs with server-side refresh-token
// rows), app passwords, invite codes, handles, the account lifecycle
// (active, deactivated, taken down, deleted), moving accounts between
// servers (migrate.go) and app.bsky preferences (preferences.go).
//
// The package knows nothing about HTTP: the pds package maps its sentinel
// errors to XRPC errors.
package account
