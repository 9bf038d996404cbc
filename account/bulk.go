package account

import (
	"context"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// What a bulk loader (bulwark-load populate) needs to write accounts' rows
// itself, in the formats this package reads back: a sealed signing key, a
// password hash and an app-password hash. CreateAccount makes the same
// values one account at a time.

// Seal encrypts did's signing key as the accounts table stores it.
func (k *KeyStore) Seal(did syntax.DID, key *atcrypto.PrivateKeyK256) ([]byte, error) {
	return k.seal(did, key)
}

// HashPassword returns pw's hash as the accounts table stores it (argon2id
// at DefaultPasswordParams, PHC format).
func HashPassword(ctx context.Context, pw string) (string, error) {
	return newHasher(DefaultPasswordParams, NewPasswordSlots(1, 0), 0).hash(ctx, pw)
}

// AppPasswordHash returns the hash the app_passwords table stores for pw,
// an app password of did.
func AppPasswordHash(ctx context.Context, did syntax.DID, pw string) ([]byte, error) {
	return newHasher(DefaultPasswordParams, NewPasswordSlots(1, 0), 0).appPasswordHash(ctx, did.String(), pw)
}
