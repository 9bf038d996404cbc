package repo_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// importEnv is an engine over a fresh database, with an account whose
// repository imports go into, and the "old server's" key that signed the
// CARs it imports.
type importEnv struct {
	pool   *pgxpool.Pool
	engine *repo.Engine
	keys   *repotest.Keys
	did    syntax.DID
	oldKey atcrypto.PrivateKey
}

func newImportEnv(t testing.TB) *importEnv {
	t.Helper()
	pool := dbtest.New(t)
	keys := repotest.NewKeys()
	engine := repo.New(pool, keys, nil, repo.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	did := syntax.DID("did:plc:importer")
	repotest.CreateRepo(t, pool, engine, keys, did)
	old, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	return &importEnv{pool: pool, engine: engine, keys: keys, did: did, oldKey: old}
}

const oldRev = "3lb2ahqo6ek2a"

func postRecord(text string) map[string]any {
	return map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T00:00:00Z"}
}

func samplePosts(n int) map[string]map[string]any {
	out := map[string]map[string]any{}
	for i := range n {
		out[fmt.Sprintf("app.bsky.feed.post/3lb2aaaa%05d", i)] = postRecord(fmt.Sprint("post ", i))
	}
	out["app.bsky.actor.profile/self"] = map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Old"}
	return out
}

// snapshot is what an import must leave alone when it fails.
func (e *importEnv) snapshot(t testing.TB) string {
	t.Helper()
	var s string
	err := e.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM records) || '/' || (SELECT count(*) FROM repo_nodes) || '/' ||
		(SELECT count(*) FROM events) || '/' || (SELECT string_agg(rev, ',') FROM repo_roots)`).Scan(&s)
	require.NoError(t, err)
	return s
}

// export returns the account's repository as getRepo serves it, loaded and
// checked by indigo, with its commit.
func (e *importEnv) export(t testing.TB) (*atrepo.Repo, *atrepo.Commit) {
	t.Helper()
	ctx := context.Background()
	var buf bytes.Buffer
	require.NoError(t, e.engine.ExportCAR(ctx, e.did, "", &buf))
	commit, r, err := atrepo.LoadRepoFromCAR(ctx, &buf)
	require.NoError(t, err)
	return r, commit
}

func TestImportRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newImportEnv(t)
	before, err := e.engine.GetHead(ctx, e.did)
	require.NoError(t, err)
	records := samplePosts(300)
	carBytes := repotest.RepoCAR(t, e.did, e.oldKey, oldRev, records)

	res, err := e.engine.Import(ctx, e.did, bytes.NewReader(carBytes), repo.ImportOptions{})
	require.NoError(t, err)
	require.EqualValues(t, len(records), res.Records)
	require.EqualValues(t, int64(len(carBytes)), res.Bytes)
	require.Greater(t, res.Rev, oldRev, "the new rev follows the imported one")
	require.Greater(t, res.Rev, before.Rev, "and the repository's own")

	// The stored repository is the imported tree under a commit signed
	// with the account's key, not the old server's.
	r, commit := e.export(t)
	require.Equal(t, res.Commit.String(), mustCommitCID(t, e, ctx).String())
	require.NoError(t, commit.VerifySignature(e.keys.Public(t, e.did)))
	oldPub, err := e.oldKey.PublicKey()
	require.NoError(t, err)
	require.Error(t, commit.VerifySignature(oldPub))
	require.Equal(t, res.Data, commit.Data)
	n := 0
	require.NoError(t, r.MST.Walk(func(key []byte, val cid.Cid) error {
		n++
		rec, err := e.engine.GetRecord(ctx, e.did, syntax.NSID(bytes.Split(key, []byte("/"))[0]), syntax.RecordKey(bytes.Split(key, []byte("/"))[1]))
		require.NoError(t, err)
		require.Equal(t, val, rec.CID)
		want, err := atdata.MarshalCBOR(records[string(key)])
		require.NoError(t, err)
		require.Equal(t, want, rec.Data)
		return nil
	}))
	require.Equal(t, len(records), n)

	// The import is announced as #sync; the engine writes on top of it.
	var kind, rev string
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT kind, rev FROM events WHERE did = $1 ORDER BY id DESC LIMIT 1", e.did.String()).Scan(&kind, &rev))
	require.Equal(t, "sync", kind)
	require.Equal(t, res.Rev, rev)
	after, err := e.engine.Apply(ctx, e.did, []repo.Write{
		{Action: repo.ActionCreate, Collection: "app.bsky.feed.post", RKey: "3zzzzzzzzzzzz", Record: postRecord("after")},
		{Action: repo.ActionDelete, Collection: "app.bsky.feed.post", RKey: "3lb2aaaa00007"},
	}, nil)
	require.NoError(t, err)
	require.Greater(t, after.Rev, res.Rev)
	r, _ = e.export(t)
	count := 0
	require.NoError(t, r.MST.Walk(func([]byte, cid.Cid) error { count++; return nil }))
	require.Equal(t, len(records), count)
}

func mustCommitCID(t testing.TB, e *importEnv, ctx context.Context) cid.Cid {
	t.Helper()
	h, err := e.engine.GetHead(ctx, e.did)
	require.NoError(t, err)
	return h.Commit
}

// TestImportReplaces imports into a repository that already holds
// records: the import replaces it whole.
func TestImportReplaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newImportEnv(t)
	_, err := e.engine.Apply(ctx, e.did, []repo.Write{
		{Action: repo.ActionCreate, Collection: "app.bsky.feed.like", RKey: "3aaaaaaaaaaaa", Record: map[string]any{"$type": "app.bsky.feed.like"}},
	}, nil)
	require.NoError(t, err)
	records := samplePosts(3)
	_, err = e.engine.Import(ctx, e.did, bytes.NewReader(repotest.RepoCAR(t, e.did, e.oldKey, oldRev, records)), repo.ImportOptions{})
	require.NoError(t, err)
	n, err := e.engine.CountRecords(ctx, e.did)
	require.NoError(t, err)
	require.EqualValues(t, len(records), n)
	_, err = e.engine.GetRecord(ctx, e.did, "app.bsky.feed.like", "3aaaaaaaaaaaa")
	require.ErrorIs(t, err, repo.ErrRecordNotFound)

	// An empty repository imports too, and empties this one.
	_, err = e.engine.Import(ctx, e.did, bytes.NewReader(repotest.RepoCAR(t, e.did, e.oldKey, oldRev, nil)), repo.ImportOptions{})
	require.NoError(t, err)
	n, err = e.engine.CountRecords(ctx, e.did)
	require.NoError(t, err)
	require.Zero(t, n)
	e.export(t)
}

func TestImportAllowOversize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newImportEnv(t)
	records := samplePosts(2)
	// Two strings, each within the data model's string limit.
	big := postRecord(string(bytes.Repeat([]byte("x"), 550_000)))
	big["extra"] = string(bytes.Repeat([]byte("y"), 550_000))
	records["app.bsky.feed.post/3big"] = big
	carBytes := repotest.RepoCAR(t, e.did, e.oldKey, oldRev, records)

	before := e.snapshot(t)
	_, err := e.engine.Import(ctx, e.did, bytes.NewReader(carBytes), repo.ImportOptions{})
	var oe *repo.OversizeRecordsError
	require.ErrorAs(t, err, &oe)
	require.ErrorIs(t, err, repo.ErrLimitExceeded)
	require.Equal(t, 1, oe.Total)
	require.Contains(t, err.Error(), "app.bsky.feed.post/3big (1,100,0")
	require.Equal(t, before, e.snapshot(t))

	res, err := e.engine.Import(ctx, e.did, bytes.NewReader(carBytes), repo.ImportOptions{AllowOversize: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.OversizeTotal)
	require.Equal(t, "app.bsky.feed.post/3big", res.Oversize[0].Path)
	rec, err := e.engine.GetRecord(ctx, e.did, "app.bsky.feed.post", "3big")
	require.NoError(t, err)
	require.Greater(t, len(rec.Data), 1_048_576)
	e.export(t)
}
