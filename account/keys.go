package account

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/repo"
)

// keyBlobVersion is the first byte of a sealed signing key, so that the
// format (or the secret it is sealed with) can change later.
const keyBlobVersion = 1

// keyInfo separates this use of the server secret from any other.
const keyInfo = "bulwark account signing key encryption v1"

// DefaultKeyCacheSize is how many decrypted signing keys KeyStore keeps.
const DefaultKeyCacheSize = 10_000

// KeyStore keeps accounts' repository signing keys: sealed with AES-256-GCM
// in the accounts table (the DID as associated data, so a sealed key cannot
// be moved to another account), opened on first use and cached in memory.
// It implements repo.KeySource.
//
// The sealing key is derived (HKDF-SHA256) from a server secret. Bulwark
// uses the PLC rotation key's bytes: that key must never change or be lost
// anyway (it controls every account's DID), whereas the JWT secret is one an
// operator may rotate to end all sessions. Losing the rotation key therefore
// also makes the signing keys unreadable; back it up.
type KeyStore struct {
	pool *pgxpool.Pool
	aead cipher.AEAD
	// reserve derives the signing keys reserved for DIDs (reserved.go).
	reserve []byte

	mu    sync.Mutex
	cache map[syntax.DID]*atcrypto.PrivateKeyK256
	max   int
}

var _ repo.KeySource = (*KeyStore)(nil)

// NewKeyStore returns a key store over pool sealing with a key derived from
// secret (at least 32 bytes).
func NewKeyStore(pool *pgxpool.Pool, secret []byte) (*KeyStore, error) {
	if len(secret) < 32 {
		return nil, errors.New("account: key-encryption secret must be at least 32 bytes")
	}
	k, err := hkdf.Key(sha256.New, secret, nil, keyInfo, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	reserve, err := hkdf.Key(sha256.New, secret, nil, reserveInfo, 32)
	if err != nil {
		return nil, err
	}
	return &KeyStore{pool: pool, aead: aead, reserve: reserve, cache: map[syntax.DID]*atcrypto.PrivateKeyK256{}, max: DefaultKeyCacheSize}, nil
}

// SigningKey returns did's signing key. An unknown DID is
// repo.ErrRepoNotFound.
func (k *KeyStore) SigningKey(ctx context.Context, did syntax.DID) (atcrypto.PrivateKey, error) {
	k.mu.Lock()
	key, ok := k.cache[did]
	k.mu.Unlock()
	if ok {
		return key, nil
	}
	var blob []byte
	err := db.Translate(k.pool.QueryRow(ctx, qGetSigningKey, did.String()).Scan(&blob))
	if errors.Is(err, db.ErrNotFound) {
		return nil, fmt.Errorf("%w: no account %s", repo.ErrRepoNotFound, did)
	}
	if err != nil {
		return nil, fmt.Errorf("reading signing key: %w", err)
	}
	key, err = k.open(did, blob)
	if err != nil {
		return nil, err
	}
	k.remember(did, key)
	return key, nil
}

func (k *KeyStore) remember(did syntax.DID, key *atcrypto.PrivateKeyK256) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.cache) >= k.max {
		// Dropping an arbitrary entry is enough: a miss costs one indexed
		// read and one AES-GCM open.
		for d := range k.cache {
			delete(k.cache, d)
			break
		}
	}
	k.cache[did] = key
}

// forget drops did's key from the cache (account deleted).
func (k *KeyStore) forget(did syntax.DID) {
	k.mu.Lock()
	delete(k.cache, did)
	k.mu.Unlock()
}

// seal encrypts key for did.
func (k *KeyStore) seal(did syntax.DID, key *atcrypto.PrivateKeyK256) ([]byte, error) {
	nonce := make([]byte, k.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out := append([]byte{keyBlobVersion}, nonce...)
	return k.aead.Seal(out, nonce, key.Bytes(), []byte(did)), nil
}

// open decrypts a sealed key of did.
func (k *KeyStore) open(did syntax.DID, blob []byte) (*atcrypto.PrivateKeyK256, error) {
	ns := k.aead.NonceSize()
	if len(blob) < 1+ns || blob[0] != keyBlobVersion {
		return nil, fmt.Errorf("signing key of %s: unknown format", did)
	}
	raw, err := k.aead.Open(nil, blob[1:1+ns], blob[1+ns:], []byte(did))
	if err != nil {
		return nil, fmt.Errorf("signing key of %s cannot be decrypted (was the PLC rotation key changed?): %w", did, err)
	}
	return atcrypto.ParsePrivateBytesK256(raw)
}
