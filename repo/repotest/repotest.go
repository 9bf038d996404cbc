// Package repotest makes repositories for tests outside package repo: an
// in-memory signing-key source and repository creation as account creation
// does it (genesis commit plus #sync, one transaction).
package repotest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/repo"
)

// Keys is an in-memory repo.KeySource.
type Keys struct {
	mu   sync.Mutex
	keys map[syntax.DID]*atcrypto.PrivateKeyK256
}

// NewKeys returns an empty key source.
func NewKeys() *Keys {
	return &Keys{keys: map[syntax.DID]*atcrypto.PrivateKeyK256{}}
}

// SigningKey implements repo.KeySource.
func (k *Keys) SigningKey(_ context.Context, did syntax.DID) (atcrypto.PrivateKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key, ok := k.keys[did]
	if !ok {
		return nil, fmt.Errorf("%w: no key for %s", repo.ErrRepoNotFound, did)
	}
	return key, nil
}

// Add generates and keeps a new key for did.
func (k *Keys) Add(t testing.TB, did syntax.DID) *atcrypto.PrivateKeyK256 {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	k.mu.Lock()
	k.keys[did] = key
	k.mu.Unlock()
	return key
}

// Public returns did's public key.
func (k *Keys) Public(t testing.TB, did syntax.DID) atcrypto.PublicKey {
	t.Helper()
	k.mu.Lock()
	key := k.keys[did]
	k.mu.Unlock()
	require.NotNil(t, key, "no key for %s", did)
	pub, err := key.PublicKey()
	require.NoError(t, err)
	return pub
}

// CreateRepo gives did a key in keys and creates its empty repository with
// the #sync event account creation emits, in one transaction.
func CreateRepo(t testing.TB, pool *pgxpool.Pool, engine *repo.Engine, keys *Keys, did syntax.DID) *atcrypto.PrivateKeyK256 {
	t.Helper()
	ctx := context.Background()
	key := keys.Add(t, did)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := engine.InitRepo(ctx, tx, did, key); err != nil {
			return err
		}
		ev, err := engine.SyncEvent(ctx, tx, did)
		if err != nil {
			return err
		}
		return eventlog.Append(ctx, tx, ev)
	}))
	return key
}
