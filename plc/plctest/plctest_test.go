package plctest_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// storeKind opens a store of one kind; reopen returns a second store on
// the same data (nil for memory, which does not outlive its value).
type storeKind struct {
	name string
	open func(t *testing.T) (first plctest.Store, reopen func() plctest.Store)
}

func storeKinds() []storeKind {
	return []storeKind{
		{"memory", func(t *testing.T) (plctest.Store, func() plctest.Store) {
			return plctest.NewMemoryStore(), nil
		}},
		{"file", func(t *testing.T) (plctest.Store, func() plctest.Store) {
			path := filepath.Join(t.TempDir(), "plc.jsonl")
			open := func() plctest.Store {
				s, err := plctest.OpenFileStore(path)
				require.NoError(t, err)
				t.Cleanup(func() { _ = s.Close() })
				return s
			}
			return open(), open
		}},
		{"postgres", func(t *testing.T) (plctest.Store, func() plctest.Store) {
			pool := dbtest.New(t)
			return plctest.NewPostgresStore(pool), func() plctest.Store { return plctest.NewPostgresStore(pool) }
		}},
	}
}

func newKey(t *testing.T) *atcrypto.PrivateKeyK256 {
	t.Helper()
	k, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	return k
}

// newIdentity creates a DID in dir through the in-process client and
// renames it once, so that its log holds two operations.
func newIdentity(t *testing.T, dir *plctest.Directory, url string) (*plc.Client, syntax.DID) {
	t.Helper()
	ctx := context.Background()
	c, err := plc.NewClient(url, newKey(t), dir.Client())
	require.NoError(t, err)
	pub, err := newKey(t).PublicKey()
	require.NoError(t, err)
	did, op, err := c.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://localhost:2583"})
	require.NoError(t, err)
	require.NoError(t, c.Submit(ctx, did, op))
	require.NoError(t, c.UpdateHandle(ctx, did, "bob.test"))
	return c, did
}

// TestStores runs the directory on every store: operations are verified
// and kept, survive a reopen, and read back as valid logs.
func TestStores(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds() {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, reopen := kind.open(t)
			dir := plctest.NewDirectory(store)
			c, did := newIdentity(t, dir, "http://localhost:2583")

			doc, err := c.Resolve(ctx, did)
			require.NoError(t, err)
			require.Equal(t, []string{"at://bob.test"}, doc.AlsoKnownAs)
			require.Equal(t, "http://localhost:2583", doc.Service[0].ServiceEndpoint)
			require.Equal(t, 1, dir.Count())

			// A forged update is refused and leaves the log as it was.
			forger, err := plc.NewClient("http://localhost:2583", newKey(t), dir.Client())
			require.NoError(t, err)
			require.ErrorIs(t, forger.UpdateHandle(ctx, did, "mallory.test"), plc.ErrNotControlled)
			log := dir.Log(did.String())
			head := log[len(log)-1]
			forged := &didplc.TombstoneOp{Type: "plc_tombstone", Prev: head.CID}
			require.NoError(t, forged.Sign(newKey(t)))
			require.ErrorIs(t, dir.Submit(did.String(), didplc.OpEnum{Tombstone: forged}), plctest.ErrInvalidOperation)

			if reopen == nil {
				return
			}
			again := plctest.NewDirectory(reopen())
			log, err = again.Store().Log(ctx, did.String())
			require.NoError(t, err)
			require.Len(t, log, 2)
			require.NoError(t, didplc.VerifyOpLog(log))
			require.Equal(t, head.CreatedAt, log[1].CreatedAt, "times survive the store")
			require.Equal(t, 1, again.Count())
		})
	}
}

// TestSharedPostgresStore puts two directories (two servers) on one
// database: each sees the other's operations, and of two appends at the
// same place in a log exactly one is stored.
func TestSharedPostgresStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	a := plctest.NewDirectory(plctest.NewPostgresStore(pool))
	b := plctest.NewDirectory(plctest.NewPostgresStore(pool))
	_, did := newIdentity(t, a, "http://localhost:2583")

	// b carries on the log a started.
	cb, err := plc.NewClient("http://localhost:2583", newKey(t), b.Client())
	require.NoError(t, err)
	_, err = cb.Resolve(ctx, did)
	require.NoError(t, err)
	log := b.Log(did.String())
	require.Len(t, log, 2)

	// Two appends of the third entry at once: one wins, one conflicts.
	entry := log[1]
	entry.CreatedAt = "2030-01-01T00:00:00.000Z"
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range []plctest.Store{a.Store(), b.Store()} {
		wg.Go(func() { errs[i] = s.Append(ctx, 2, entry) })
	}
	wg.Wait()
	conflicts := 0
	for _, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, plctest.ErrConflict)
			conflicts++
		}
	}
	require.Equal(t, 1, conflicts, "%v", errs)
	require.Len(t, a.Log(did.String()), 3)

	// An append that skips a place is refused too.
	require.ErrorIs(t, a.Store().Append(ctx, 7, entry), plctest.ErrConflict)
	require.Len(t, a.Log(did.String()), 3)
}

// TestReadsOverHTTP serves a Postgres-backed directory: documents resolve
// for clients, reads carry CORS, and malformed paths are 404s that never
// reach the store.
func TestReadsOverHTTP(t *testing.T) {
	t.Parallel()
	dir := plctest.NewDirectory(plctest.NewPostgresStore(dbtest.New(t)))
	srv := httptest.NewServer(dir)
	t.Cleanup(srv.Close)
	_, did := newIdentity(t, dir, srv.URL)

	resp, err := http.Get(srv.URL + "/" + did.String())
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "*", resp.Header.Get("Access-Control-Allow-Origin"))
	for _, path := range []string{"/did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "/not-a-did", "/did:web:example.com", "/" + did.String() + "/nope"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
	}
}
