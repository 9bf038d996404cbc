package blob

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type fixture struct {
	pool    *pgxpool.Pool
	store   Store
	svc     *Service
	engine  *repo.Engine
	keys    *repotest.Keys
	scratch func() []string
}

func setup(t *testing.T, b backend, cfg Config) *fixture {
	t.Helper()
	pool := dbtest.New(t)
	store := b.new(t)
	svc := New(pool, store, cfg)
	keys := repotest.NewKeys()
	return &fixture{
		pool:    pool,
		store:   store,
		svc:     svc,
		engine:  repo.New(pool, keys, nil, repo.Config{Blobs: svc}),
		keys:    keys,
		scratch: func() []string { return b.scratch(t, store) },
	}
}

func (f *fixture) newRepo(t *testing.T, name string) syntax.DID {
	t.Helper()
	did := syntax.DID("did:plc:" + name)
	repotest.CreateRepo(t, f.pool, f.engine, f.keys, did)
	return did
}

// post writes a post embedding the given blobs at rkey.
func (f *fixture) post(t *testing.T, did syntax.DID, action repo.Action, rkey string, blobs ...*Blob) error {
	t.Helper()
	ctx := context.Background()
	rec := map[string]any{"$type": "app.bsky.feed.post", "text": "hi", "createdAt": "2026-11-29T00:00:00Z"}
	var refs []atdata.Blob
	if len(blobs) > 0 {
		var images []any
		for _, b := range blobs {
			images = append(images, map[string]any{"alt": "", "image": b.Ref()})
			refs = append(refs, b.Ref())
		}
		rec["embed"] = map[string]any{"$type": "app.bsky.embed.images", "images": images}
	}
	_, err := f.engine.Apply(ctx, did, []repo.Write{{
		Action: action, Collection: "app.bsky.feed.post", RKey: syntax.RecordKey(rkey), Record: rec,
	}}, nil)
	return err
}

func (f *fixture) deletePost(t *testing.T, did syntax.DID, rkey string) {
	t.Helper()
	ctx := context.Background()
	_, err := f.engine.Apply(ctx, did, []repo.Write{{
		Action: repo.ActionDelete, Collection: "app.bsky.feed.post", RKey: syntax.RecordKey(rkey),
	}}, nil)
	require.NoError(t, err)
}

// collectLater runs the collector as if d had passed.
func (f *fixture) collectLater(t *testing.T, d time.Duration) int {
	t.Helper()
	f.svc.now = func() time.Time { return time.Now().Add(d) }
	n, err := f.svc.Collect(context.Background())
	require.NoError(t, err)
	return n
}

func (f *fixture) rows(t *testing.T, did syntax.DID) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT count(*) FROM blobs WHERE did = $1", did.String()).Scan(&n))
	return n
}

func (f *fixture) readBlob(t *testing.T, did syntax.DID, b *Blob) []byte {
	t.Helper()
	meta, r, err := f.svc.Open(context.Background(), did, b.CID)
	require.NoError(t, err)
	defer r.Close()
	require.Equal(t, b.MimeType, meta.MimeType)
	require.Equal(t, b.Size, meta.Size)
	data, err := io.ReadAll(r)
	require.NoError(t, err)
	return data
}

// pngHeader starts every PNG file; DetectContentType recognises it.
var pngHeader = []byte("\x89PNG\r\n\x1a\n")

func pngBytes(t *testing.T, n int) []byte {
	return append(append([]byte{}, pngHeader...), randomBytes(t, n)...)
}

func TestUploadReferenceServe(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, b, Config{})
			did := f.newRepo(t, "alice")
			data := pngBytes(t, 200_000)
			blob, err := f.svc.Upload(ctx, did, bytes.NewReader(data), "")
			require.NoError(t, err)
			require.Equal(t, ComputeCID(data), blob.CID)
			require.True(t, strings.HasPrefix(blob.CID.String(), "bafkrei"))
			require.Equal(t, "image/png", blob.MimeType)
			require.Equal(t, int64(len(data)), blob.Size)
			require.Empty(t, f.scratch())

			// Not served until a record refers to it.
			_, _, err = f.svc.Open(ctx, did, blob.CID)
			require.ErrorIs(t, err, ErrBlobNotFound)

			require.NoError(t, f.post(t, did, repo.ActionCreate, "p1", blob))
			require.Equal(t, data, f.readBlob(t, did, blob))

			// Permanent: the collector leaves it, however late.
			require.Zero(t, f.collectLater(t, 48*time.Hour))
			require.Equal(t, data, f.readBlob(t, did, blob))

			cids, next, err := f.svc.ListBlobs(ctx, did, "", "", 10)
			require.NoError(t, err)
			require.Equal(t, []string{blob.CID.String()}, cids)
			require.Empty(t, next)
		})
	}
}

func TestDeletedAccountBlobsCollected(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, b, Config{TempTTL: time.Hour})
			did := f.newRepo(t, "gone")
			other := f.newRepo(t, "stays")
			data := pngBytes(t, 3000)
			blob, err := f.svc.Upload(ctx, did, bytes.NewReader(data), "")
			require.NoError(t, err)
			_, err = f.svc.Upload(ctx, other, bytes.NewReader(data), "")
			require.NoError(t, err)
			require.NoError(t, f.post(t, did, repo.ActionCreate, "p1", blob))
			require.NoError(t, f.post(t, other, repo.ActionCreate, "p1", blob))

			require.NoError(t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
				return f.svc.DeleteAccountTx(ctx, tx, did)
			}))
			require.Equal(t, 1, f.collectLater(t, 0), "collected at once, whatever the expiry")
			require.Zero(t, f.rows(t, did))
			require.Equal(t, data, f.readBlob(t, other, blob), "the other account's copy of the same bytes survives")
		})
	}
}

func TestUnreferencedExpires(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, b, Config{TempTTL: time.Hour})
			did := f.newRepo(t, "bob")
			blob, err := f.svc.Upload(ctx, did, bytes.NewReader(pngBytes(t, 5000)), "")
			require.NoError(t, err)

			require.Zero(t, f.collectLater(t, 0), "not expired yet")
			require.Equal(t, 1, f.rows(t, did))
			_, err = f.store.Stat(ctx, blob.CID.String())
			require.NoError(t, err)

			require.Equal(t, 1, f.collectLater(t, 2*time.Hour))
			require.Zero(t, f.rows(t, did))
			_, err = f.store.Stat(ctx, blob.CID.String())
			require.ErrorIs(t, err, ErrObjectNotFound)

			// An expired blob can no longer be referenced.
			err = f.post(t, did, repo.ActionCreate, "late", blob)
			require.ErrorIs(t, err, ErrBlobNotFound)
		})
	}
}

func TestDeletingLastReferenceReleases(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, b, Config{TempTTL: time.Hour})
			did := f.newRepo(t, "carol")
			shared, err := f.svc.Upload(ctx, did, bytes.NewReader(pngBytes(t, 3000)), "")
			require.NoError(t, err)
			only, err := f.svc.Upload(ctx, did, bytes.NewReader(pngBytes(t, 3000)), "")
			require.NoError(t, err)
			require.NoError(t, f.post(t, did, repo.ActionCreate, "a", shared, only))
			require.NoError(t, f.post(t, did, repo.ActionCreate, "b", shared))

			// Updating a to drop `only` releases it; `shared` is still in b.
			require.NoError(t, f.post(t, did, repo.ActionUpdate, "a", shared))
			_, _, err = f.svc.Open(ctx, did, only.CID)
			require.ErrorIs(t, err, ErrBlobNotFound, "a released blob is no longer served")
			require.Equal(t, 1, f.collectLater(t, 2*time.Hour))

			f.deletePost(t, did, "a")
			require.Zero(t, f.collectLater(t, 2*time.Hour), "b still refers to shared")
			f.deletePost(t, did, "b")
			require.Zero(t, f.collectLater(t, 0), "released blobs get the expiry grace period")
			require.Equal(t, 1, f.collectLater(t, 2*time.Hour))
			require.Zero(t, f.rows(t, did))
			_, err = f.store.Stat(ctx, shared.CID.String())
			require.ErrorIs(t, err, ErrObjectNotFound)
		})
	}
}

func TestReferenceToUnknownBlobRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, backends[0], Config{})
	ctx := context.Background()
	alice, mallory := f.newRepo(t, "alice"), f.newRepo(t, "mallory")
	blob, err := f.svc.Upload(ctx, alice, bytes.NewReader(pngBytes(t, 100)), "")
	require.NoError(t, err)

	// Never uploaded by anyone.
	ghost := &Blob{CID: ComputeCID([]byte("nobody uploaded this")), MimeType: "image/png", Size: 20}
	err = f.post(t, alice, repo.ActionCreate, "x", ghost)
	require.ErrorIs(t, err, ErrBlobNotFound)
	require.Contains(t, err.Error(), ghost.CID.String())

	// Uploaded by someone else: still refused, and nothing was committed.
	err = f.post(t, mallory, repo.ActionCreate, "x", blob)
	require.ErrorIs(t, err, ErrBlobNotFound)
	head, err := f.engine.GetHead(ctx, mallory)
	require.NoError(t, err)
	err = f.post(t, mallory, repo.ActionCreate, "x", blob)
	require.ErrorIs(t, err, ErrBlobNotFound)
	after, err := f.engine.GetHead(ctx, mallory)
	require.NoError(t, err)
	require.Equal(t, head.Rev, after.Rev)
	n, err := f.engine.CountRecords(ctx, mallory)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestOverSizeKeepsNothing(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, b, Config{MaxBytes: 100_000})
			did := f.newRepo(t, "dave")
			data := randomBytes(t, 100_001)
			_, err := f.svc.Upload(ctx, did, bytes.NewReader(data), "")
			var tooLarge *TooLargeError
			require.ErrorAs(t, err, &tooLarge)
			require.ErrorIs(t, err, ErrTooLarge)
			require.Equal(t, int64(100_000), tooLarge.Max)
			require.Zero(t, f.rows(t, did))
			require.Empty(t, f.scratch())
			_, err = f.store.Stat(ctx, ComputeCID(data).String())
			require.ErrorIs(t, err, ErrObjectNotFound)

			// Exactly at the limit is fine.
			_, err = f.svc.Upload(ctx, did, bytes.NewReader(data[:100_000]), "")
			require.NoError(t, err)
		})
	}
}

func TestMIMESniffed(t *testing.T) {
	t.Parallel()
	f := setup(t, backends[0], Config{})
	ctx := context.Background()
	did := f.newRepo(t, "erin")
	for _, tc := range []struct {
		data []byte
		want string
	}{
		{pngBytes(t, 10), "image/png"},
		{[]byte("\xff\xd8\xff\xe0 jpeg"), "image/jpeg"},
		{[]byte("<!DOCTYPE html><script>alert(1)</script>"), "text/html; charset=utf-8"},
		{[]byte("just words"), "text/plain; charset=utf-8"},
		{[]byte{0, 1, 2, 3, 4}, "application/octet-stream"},
		{nil, "text/plain; charset=utf-8"},
	} {
		b, err := f.svc.Upload(ctx, did, bytes.NewReader(tc.data), "")
		require.NoError(t, err)
		require.Equal(t, tc.want, b.MimeType, "%q", tc.data)
	}
}

func TestConcurrentIdenticalUploads(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			f := setup(t, b, Config{TempTTL: time.Hour})
			alice, bob := f.newRepo(t, "alice"), f.newRepo(t, "bob")
			data := pngBytes(t, 400_000)

			var wg sync.WaitGroup
			results := make([]*Blob, 8)
			errs := make([]error, 8)
			for i := range results {
				did := alice
				if i%2 == 1 {
					did = bob
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i], errs[i] = f.svc.Upload(ctx, did, bytes.NewReader(data), "")
				}()
			}
			wg.Wait()
			for i := range results {
				require.NoError(t, errs[i])
				require.Equal(t, results[0].CID, results[i].CID)
			}
			require.Equal(t, 1, f.rows(t, alice))
			require.Equal(t, 1, f.rows(t, bob))
			require.Empty(t, f.scratch())

			// Bob posts it; Alice's copy expires. The object must stay.
			require.NoError(t, f.post(t, bob, repo.ActionCreate, "p", results[1]))
			require.Equal(t, 1, f.collectLater(t, 2*time.Hour))
			require.Zero(t, f.rows(t, alice))
			require.Equal(t, data, f.readBlob(t, bob, results[1]))
		})
	}
}

func TestRaceUploadAgainstCollector(t *testing.T) {
	t.Parallel()
	// Alice's expired copy is collected while Bob uploads the same bytes:
	// whatever the interleaving, Bob's blob must end up readable.
	f := setup(t, backends[0], Config{TempTTL: time.Hour})
	ctx := context.Background()
	alice, bob := f.newRepo(t, "alice"), f.newRepo(t, "bob")
	for i := range 5 {
		data := pngBytes(t, 1000+i)
		_, err := f.svc.Upload(ctx, alice, bytes.NewReader(data), "")
		require.NoError(t, err)
		// Alice's copy expired an hour ago; Bob's upload is fresh.
		_, err = f.pool.Exec(ctx, "UPDATE blobs SET temp_since = now() - interval '2 hours' WHERE did = $1", alice.String())
		require.NoError(t, err)
		var wg sync.WaitGroup
		var up *Blob
		var upErr, gcErr error
		wg.Add(2)
		go func() { defer wg.Done(); up, upErr = f.svc.Upload(ctx, bob, bytes.NewReader(data), "") }()
		go func() { defer wg.Done(); _, gcErr = f.svc.Collect(ctx) }()
		wg.Wait()
		require.NoError(t, upErr)
		require.NoError(t, gcErr)
		require.NoError(t, f.post(t, bob, repo.ActionCreate, fmt.Sprintf("p%d", i), up))
		require.Equal(t, data, f.readBlob(t, bob, up))
	}
}

func TestListMissing(t *testing.T) {
	t.Parallel()
	f := setup(t, backends[0], Config{})
	ctx := context.Background()
	did := f.newRepo(t, "frank")
	// A reference without an upload, as an imported repository leaves.
	ghost := ComputeCID([]byte("imported")).String()
	_, err := f.pool.Exec(ctx, "INSERT INTO record_blobs (did, record_path, blob_cid, rev) VALUES ($1, 'app.bsky.feed.post/x', $2, 'r')", did.String(), ghost)
	require.NoError(t, err)
	missing, next, err := f.svc.ListMissing(ctx, did, "", 10)
	require.NoError(t, err)
	require.Empty(t, next)
	require.Equal(t, []MissingBlob{{CID: ghost, RecordPath: "app.bsky.feed.post/x"}}, missing)

	// Uploading it fills the gap, and it is permanent at once.
	b, err := f.svc.Upload(ctx, did, bytes.NewReader([]byte("imported")), "")
	require.NoError(t, err)
	require.Equal(t, ghost, b.CID.String())
	missing, _, err = f.svc.ListMissing(ctx, did, "", 10)
	require.NoError(t, err)
	require.Empty(t, missing)
	require.Zero(t, f.collectLater(t, 48*time.Hour))
}

func TestBlobRefShape(t *testing.T) {
	t.Parallel()
	b := &Blob{CID: ComputeCID([]byte("x")), MimeType: "image/png", Size: 1}
	ref := b.Ref()
	out, err := ref.MarshalJSON()
	require.NoError(t, err)
	require.JSONEq(t, fmt.Sprintf(`{"$type":"blob","ref":{"$link":%q},"mimeType":"image/png","size":1}`, b.CID), string(out))
}

// TestRunCollectsUntilStopped: Run collects at once and then on every tick
// of its clock (the test's), until its context ends.
func TestRunCollectsUntilStopped(t *testing.T) {
	t.Parallel()
	f := setup(t, backends[0], Config{TempTTL: time.Hour})
	ctx := context.Background()
	did := f.newRepo(t, "gina")
	_, err := f.svc.Upload(ctx, did, bytes.NewReader(pngBytes(t, 10)), "")
	require.NoError(t, err)
	ticks, passes := make(chan time.Time), make(chan int)
	f.svc.tick, f.svc.passes = ticks, passes
	pass := func() int {
		t.Helper()
		select {
		case n := <-passes:
			return n
		case <-time.After(time.Minute):
			t.Fatal("Run made no collection pass")
			return 0
		}
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.svc.Run(runCtx) }()
	require.Zero(t, pass(), "the upload is fresh: nothing to collect at start")
	_, err = f.pool.Exec(ctx, "UPDATE blobs SET temp_since = now() - interval '2 hours'")
	require.NoError(t, err)
	ticks <- time.Now()
	require.Equal(t, 1, pass())
	require.Zero(t, f.rows(t, did))
	cancel()
	require.NoError(t, <-done)
}
