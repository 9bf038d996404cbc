package pds

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	cbor "github.com/ipfs/go-ipld-cbor"
	"github.com/ipld/go-car"
	"github.com/ipld/go-car/util"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/limits"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// syncBundle is a running server with a repository engine, accounts and
// blobs, on a fresh database.
type syncBundle struct {
	url      string
	pool     *pgxpool.Pool
	engine   *repo.Engine
	blobs    *blob.Service
	store    blob.Store
	keys     *repotest.Keys
	accounts *account.Service
	// caller is the account uploads are made as (the auth test hook).
	callerMu sync.Mutex
	caller   syntax.DID
	server   *Server
}

type syncOptions struct {
	s3        bool
	configure func(*config.Config)
	// realAuth leaves session auth in place instead of the caller hook.
	realAuth bool
	// exportSlots is Options.ExportSlots.
	exportSlots int
	// carCache turns the getRepo CAR cache on (in the data dir).
	carCache bool
	// bodyRate replaces the minimum rate of long-running request bodies.
	bodyRate *bodyRate
	// budget is Options.Budget.
	budget *budget.Budget
}

func syncSetup(t testing.TB, o syncOptions) *syncBundle {
	t.Helper()
	ctx := context.Background()
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	if o.configure != nil {
		o.configure(cfg)
	}
	require.NoError(t, cfg.Finalize())
	pool := dbtest.New(t)
	var store blob.Store
	var err error
	if o.s3 {
		store = newFakeS3(t)
	} else {
		store, err = blob.NewDiskStore(cfg.BlobDir)
		require.NoError(t, err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	blobs := blob.New(pool, store, blob.Config{MaxBytes: cfg.BlobMaxBytes, TempTTL: cfg.BlobTempTTL, Logger: logger})
	keys := repotest.NewKeys()
	engine := repo.New(pool, keys, nil, repo.Config{Blobs: blobs, Logger: logger})

	rotation, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	plcClient, err := plc.NewClient("http://127.0.0.1:9", rotation, nil) // never called: accounts are made by hand
	require.NoError(t, err)
	ks, err := account.NewKeyStore(pool, bytes.Repeat([]byte("k"), 32))
	require.NoError(t, err)
	accounts, err := account.New(account.Config{
		Pool: pool, Keys: ks, Repo: engine, PLC: plcClient, HandleDomains: []string{".test"},
		PublicURL: "http://localhost", ServiceDID: "did:web:localhost", JWTSecret: bytes.Repeat([]byte("s"), 32), Logger: logger,
	})
	require.NoError(t, err)

	b := &syncBundle{pool: pool, engine: engine, blobs: blobs, store: store, keys: keys, accounts: accounts}
	opts := Options{Config: cfg, DB: pool, Logger: logger, Version: "test", Repo: engine, Accounts: accounts, Blobs: blobs, ExportSlots: o.exportSlots, bodyRate: o.bodyRate, Budget: o.budget}
	if o.carCache {
		opts.CARCacheDir = filepath.Join(cfg.DataDir, "car-cache")
	}
	s, err := New(opts)
	require.NoError(t, err)
	b.server = s
	if !o.realAuth {
		s.callerDID = func(*http.Request) (syntax.DID, error) {
			b.callerMu.Lock()
			defer b.callerMu.Unlock()
			if b.caller == "" {
				return "", AuthRequired("no caller set")
			}
			return b.caller, nil
		}
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	b.url = ts.URL
	_ = ctx
	return b
}

func (b *syncBundle) as(did syntax.DID) {
	b.callerMu.Lock()
	b.caller = did
	b.callerMu.Unlock()
}

// newAccount makes an account row (status as given) and its empty
// repository, as account creation would, without a PLC directory.
func (b *syncBundle) newAccount(t testing.TB, name string, status account.Status) syntax.DID {
	t.Helper()
	ctx := context.Background()
	did := syntax.DID("did:plc:" + name)
	_, err := b.pool.Exec(ctx, "INSERT INTO accounts (did, handle, password_hash, signing_key, status) VALUES ($1, $2, 'x', '\\x00', $3)",
		did.String(), name+".test", string(status))
	require.NoError(t, err)
	repotest.CreateRepo(t, b.pool, b.engine, b.keys, did)
	return did
}

func (b *syncBundle) setStatus(t testing.TB, did syntax.DID, status account.Status) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), "UPDATE accounts SET status = $2 WHERE did = $1", did.String(), string(status))
	require.NoError(t, err)
}

func postRecord(text string, blobs ...atdata.Blob) map[string]any {
	rec := map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-11-29T00:00:00Z"}
	if len(blobs) > 0 {
		var images []any
		for _, b := range blobs {
			images = append(images, map[string]any{"alt": "", "image": b})
		}
		rec["embed"] = map[string]any{"$type": "app.bsky.embed.images", "images": images}
	}
	return rec
}

// writePosts creates n posts (rkeys prefix000000…) in commits of up to 200.
func (b *syncBundle) writePosts(t testing.TB, did syntax.DID, prefix string, n int) *repo.CommitResult {
	t.Helper()
	var last *repo.CommitResult
	for start := 0; start < n; start += limits.MaxCommitOps {
		var writes []repo.Write
		for i := start; i < min(n, start+limits.MaxCommitOps); i++ {
			writes = append(writes, repo.Write{
				Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
				RKey: syntax.RecordKey(fmt.Sprintf("%s%06d", prefix, i)), Record: postRecord(fmt.Sprint("post ", i)),
			})
		}
		res, err := b.engine.Apply(context.Background(), did, writes, nil)
		require.NoError(t, err)
		last = res
	}
	return last
}

func (b *syncBundle) get(t testing.TB, method string, params url.Values) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(b.url + "/xrpc/" + method + "?" + params.Encode())
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

func requireXRPC(t testing.TB, resp *http.Response, body []byte, status int, name string) {
	t.Helper()
	require.Equal(t, status, resp.StatusCode, "body: %s", body)
	var e xrpcErrorBody
	require.NoError(t, json.Unmarshal(body, &e), "body: %s", body)
	require.Equal(t, name, e.Error, "body: %s", body)
}

// recordIndex reads the record index of did straight from the database.
func (b *syncBundle) recordIndex(t testing.TB, did syntax.DID) map[string]string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT collection || '/' || rkey, cid FROM records WHERE did = $1", did.String())
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var path string
		var raw []byte
		require.NoError(t, rows.Scan(&path, &raw))
		c, err := cid.Cast(raw)
		require.NoError(t, err)
		out[path] = c.String()
	}
	require.NoError(t, rows.Err())
	return out
}

// requireCARMatchesIndex loads a getRepo CAR with indigo and checks that its
// MST holds exactly the record index.
func requireCARMatchesIndex(t testing.TB, car io.Reader, index map[string]string) *atrepo.Commit {
	t.Helper()
	ctx := context.Background()
	commit, r, err := atrepo.LoadRepoFromCAR(ctx, car)
	require.NoError(t, err)
	require.False(t, r.MST.IsPartial(), "a full export holds every MST node")
	inTree := make(map[string]string, len(index))
	require.NoError(t, r.MST.Walk(func(k []byte, v cid.Cid) error {
		inTree[string(k)] = v.String()
		return nil
	}))
	require.Equal(t, index, inTree)
	return commit
}

func TestGetRepo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "alice", account.StatusActive)
	first := b.writePosts(t, did, "a", 450)

	resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.Equal(t, "application/vnd.ipld.car", resp.Header.Get("Content-Type"))
	commit := requireCARMatchesIndex(t, bytes.NewReader(body), b.recordIndex(t, did))
	require.Equal(t, first.Rev, commit.Rev)
	pub := b.keys.Public(t, did)
	require.NoError(t, commit.VerifySignature(pub))

	// since: only what changed after that rev follows the commit.
	b.writePosts(t, did, "b", 3)
	resp, body = b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}, "since": {first.Rev}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	c2, blocks, err := atrepo.LoadCommitFromCAR(ctx, bytes.NewReader(body))
	_ = blocks
	require.NoError(t, err)
	require.Greater(t, c2.Rev, first.Rev)
	require.Less(t, len(body), 20_000, "a since export holds the diff, not the repo")
	for i := range 3 {
		rec, err := b.engine.GetRecord(ctx, did, "app.bsky.feed.post", syntax.RecordKey(fmt.Sprintf("b%06d", i)))
		require.NoError(t, err)
		require.True(t, bytes.Contains(body, rec.CID.Bytes()), "new record b%06d is in the since export", i)
	}
	// HEAD takes the same path: same status and type, no body.
	hresp, _ := do(t, http.MethodHead, b.url+"/xrpc/com.atproto.sync.getRepo?did="+did.String(), nil, nil)
	require.Equal(t, http.StatusOK, hresp.StatusCode)
	require.Equal(t, "application/vnd.ipld.car", hresp.Header.Get("Content-Type"))
}

// TestGetRepoFromCache: a whole-repository getRepo is exported once into
// the CAR cache and then served from the file while the repository is
// unchanged; a write makes the next request export again (and the old file
// go); requests that miss at once share one export; a takedown is still
// refused; the bytes are the same as an uncached export's.
func TestGetRepoFromCache(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{carCache: true})
	did := b.newAccount(t, "alice", account.StatusActive)
	b.writePosts(t, did, "a", 300)
	cache := b.server.carCache
	require.NotNil(t, cache)
	getRepo := func() []byte {
		resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
		require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
		require.Equal(t, strconv.Itoa(len(body)), resp.Header.Get("Content-Length"))
		return body
	}
	hits := func() float64 { return scrape(t)["bulwark_car_cache_hits_total"] }
	first := getRepo()
	requireCARMatchesIndex(t, bytes.NewReader(first), b.recordIndex(t, did))
	before := hits()
	require.Equal(t, int64(1), cache.builds.Load())
	require.Equal(t, first, getRepo(), "served again from the file")
	require.Equal(t, int64(1), cache.builds.Load())
	require.GreaterOrEqual(t, hits()-before, 1.0, "counted in bulwark_car_cache_hits_total")
	hresp, _ := do(t, http.MethodHead, b.url+"/xrpc/com.atproto.sync.getRepo?did="+did.String(), nil, nil)
	require.Equal(t, http.StatusOK, hresp.StatusCode)
	require.Equal(t, strconv.Itoa(len(first)), hresp.Header.Get("Content-Length"))

	// The same export, uncached, is the same bytes.
	var direct bytes.Buffer
	require.NoError(t, b.engine.ExportCAR(context.Background(), did, "", &direct))
	require.Equal(t, direct.Bytes(), first)

	// A write: the next answer is the new commit, and only its file is kept.
	last := b.writePosts(t, did, "b", 2)
	second := getRepo()
	commit := requireCARMatchesIndex(t, bytes.NewReader(second), b.recordIndex(t, did))
	require.Equal(t, last.Rev, commit.Rev)
	require.Equal(t, int64(2), cache.builds.Load())
	files, err := filepath.Glob(filepath.Join(cache.dir, "*.car"))
	require.NoError(t, err)
	require.Len(t, files, 1)

	// Eight requests that miss together share one export.
	b.writePosts(t, did, "c", 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { getRepo() })
	}
	wg.Wait()
	require.Equal(t, int64(3), cache.builds.Load())

	// A cached repository taken down is refused like any other.
	b.setStatus(t, did, account.StatusTakendown)
	resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "body: %s", body)
	require.Contains(t, string(body), "RepoTakendown")
}

// TestGetRepoPaced: with --export-rate getRepo answers are sent no faster
// than the rate (the first chunk goes at once; the rest take at least half
// of their size/rate here: a lower bound, which a slow machine cannot
// break).
func TestGetRepoPaced(t *testing.T) {
	t.Parallel()
	const rate = 100_000
	b := syncSetup(t, syncOptions{configure: func(c *config.Config) { c.ExportRate = rate }})
	did := b.newAccount(t, "alice", account.StatusActive)
	b.writePosts(t, did, "a", 1200)
	start := time.Now()
	resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
	elapsed := time.Since(start)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.Greater(t, len(body), 2*streamBuffer, "several chunks, so pacing shows")
	require.GreaterOrEqual(t, elapsed, time.Duration(float64(len(body)-streamBuffer)/rate/2*float64(time.Second)))
}

// TestCachedGetRepoRefusedWithoutDatabase: with the cached-answer slots
// taken, getRepo is refused 503 before it touches the database (no pool
// acquisition), as a refusal under a scraper flood must be.
func TestCachedGetRepoRefusedWithoutDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := syncSetup(t, syncOptions{carCache: true, configure: func(c *config.Config) { c.InflightQueue = 0 }})
	did := b.newAccount(t, "alice", account.StatusActive)
	b.writePosts(t, did, "a", 10)
	slots := b.server.protect.cachedExports
	hold, err := slots.Acquire(ctx, slots.Capacity())
	require.NoError(t, err)
	before := b.pool.Stat().AcquireCount()
	resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "body: %s", body)
	require.Contains(t, string(body), "ServiceOverloaded")
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	require.Equal(t, before, b.pool.Stat().AcquireCount(), "no database work for a refusal")
	hold.Release()
	resp, body = b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
}

// TestCARCacheEvicts: past its size the cache drops the least recently
// served repositories' files.
func TestCARCacheEvicts(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{carCache: true, configure: func(c *config.Config) { c.CARCache = 120_000 }})
	var dids []syntax.DID
	for i := range 4 {
		did := b.newAccount(t, fmt.Sprintf("user%d", i), account.StatusActive)
		b.writePosts(t, did, "a", 200) // a CAR of ~50 kB
		dids = append(dids, did)
	}
	for _, did := range dids {
		resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
		require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	}
	cache := b.server.carCache
	cache.mu.Lock()
	used, kept := cache.used, cache.lru.Len()
	cache.mu.Unlock()
	require.LessOrEqual(t, used, int64(120_000))
	require.Less(t, kept, len(dids))
	files, err := filepath.Glob(filepath.Join(cache.dir, "*.car"))
	require.NoError(t, err)
	require.Len(t, files, kept, "evicted files are deleted")
	// The most recently served is still there.
	f, _ := cache.open(dids[3].String(), mustHead(t, b, dids[3]))
	require.NotNil(t, f)
	f.Close()
}

func mustHead(t *testing.T, b *syncBundle, did syntax.DID) string {
	t.Helper()
	h, err := b.engine.GetHead(context.Background(), did)
	require.NoError(t, err)
	return h.Commit.String()
}

func TestSyncBadInput(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "alice", account.StatusActive).String()
	for _, tc := range []struct {
		method string
		params url.Values
		name   string
	}{
		{"com.atproto.sync.getRepo", url.Values{}, "InvalidRequest"},
		{"com.atproto.sync.getRepo", url.Values{"did": {"not-a-did"}}, "InvalidRequest"},
		{"com.atproto.sync.getRepo", url.Values{"did": {did}, "since": {"yesterday"}}, "InvalidRequest"},
		{"com.atproto.sync.getRepo", url.Values{"did": {"did:plc:nobody"}}, "RepoNotFound"},
		{"com.atproto.sync.getLatestCommit", url.Values{"did": {"did:plc:nobody"}}, "RepoNotFound"},
		{"com.atproto.sync.getRecord", url.Values{"did": {did}, "collection": {"not an nsid"}, "rkey": {"x"}}, "InvalidRequest"},
		{"com.atproto.sync.getRecord", url.Values{"did": {did}, "collection": {"app.bsky.feed.post"}, "rkey": {"a/b"}}, "InvalidRequest"},
		{"com.atproto.sync.getBlocks", url.Values{"did": {did}}, "InvalidRequest"},
		{"com.atproto.sync.getBlocks", url.Values{"did": {did}, "cids": {"nope"}}, "InvalidRequest"},
		{"com.atproto.sync.getBlocks", url.Values{"did": {did}, "cids": {blob.ComputeCID([]byte("x")).String()}}, "BlockNotFound"},
		{"com.atproto.sync.listRepos", url.Values{"limit": {"0"}}, "InvalidRequest"},
		{"com.atproto.sync.listRepos", url.Values{"limit": {"1001"}}, "InvalidRequest"},
		{"com.atproto.sync.getRepoStatus", url.Values{"did": {"did:plc:nobody"}}, "RepoNotFound"},
		{"com.atproto.sync.listBlobs", url.Values{"did": {did}, "limit": {"abc"}}, "InvalidRequest"},
		{"com.atproto.sync.getBlob", url.Values{"did": {did}, "cid": {"bafy-nope"}}, "InvalidRequest"},
		{"com.atproto.sync.getBlob", url.Values{"did": {did}, "cid": {blob.ComputeCID([]byte("x")).String()}}, "BlobNotFound"},
	} {
		resp, body := b.get(t, tc.method, tc.params)
		requireXRPC(t, resp, body, http.StatusBadRequest, tc.name)
	}
	many := url.Values{"did": {did}}
	for i := range MaxGetBlocks + 1 {
		many.Add("cids", blob.ComputeCID([]byte(fmt.Sprint(i))).String())
	}
	resp, err := http.Post(b.url+"/xrpc/com.atproto.sync.getBlocks", "application/json", nil)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	r2, body := b.get(t, "com.atproto.sync.getBlocks", many)
	requireXRPC(t, r2, body, http.StatusBadRequest, "InvalidRequest")
}

func TestSyncGetRecordIsAProof(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "alice", account.StatusActive)
	b.writePosts(t, did, "p", 300)

	// The verifier knows the account's key only from its DID document.
	pub := b.keys.Public(t, did)
	ident := identity.Identity{DID: did, Keys: map[string]identity.VerificationMethod{
		"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()},
	}}
	docKey, err := ident.PublicKey()
	require.NoError(t, err)

	for _, rkey := range []string{"p000000", "p000123", "p000299"} {
		want, err := b.engine.GetRecord(ctx, did, "app.bsky.feed.post", syntax.RecordKey(rkey))
		require.NoError(t, err)
		resp, body := b.get(t, "com.atproto.sync.getRecord", url.Values{"did": {did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {rkey}})
		require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
		require.Equal(t, "application/vnd.ipld.car", resp.Header.Get("Content-Type"))
		commit, r, err := atrepo.LoadRepoFromCAR(ctx, bytes.NewReader(body))
		require.NoError(t, err)
		require.NoError(t, commit.VerifySignature(docKey), "the commit is signed by the DID document's key")
		require.True(t, r.MST.IsPartial(), "a proof holds a path, not the whole tree")
		got, err := r.GetRecordCID(ctx, "app.bsky.feed.post", syntax.RecordKey(rkey))
		require.NoError(t, err)
		require.Equal(t, want.CID, *got)
		data, _, err := r.GetRecordBytes(ctx, "app.bsky.feed.post", syntax.RecordKey(rkey))
		require.NoError(t, err)
		require.Equal(t, want.Data, data)
	}
	// Absence is proven too.
	resp, body := b.get(t, "com.atproto.sync.getRecord", url.Values{"did": {did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {"zzz"}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	_, r, err := atrepo.LoadRepoFromCAR(ctx, bytes.NewReader(body))
	require.NoError(t, err)
	_, err = r.GetRecordCID(ctx, "app.bsky.feed.post", "zzz")
	require.ErrorIs(t, err, atrepo.ErrNotFound)
}

func TestGetLatestCommitAndBlocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "alice", account.StatusActive)
	res := b.writePosts(t, did, "p", 5)

	resp, body := b.get(t, "com.atproto.sync.getLatestCommit", url.Values{"did": {did.String()}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	var latest struct{ Cid, Rev string }
	require.NoError(t, json.Unmarshal(body, &latest))
	require.Equal(t, res.Commit.String(), latest.Cid)
	require.Equal(t, res.Rev, latest.Rev)

	head, err := b.engine.GetHead(ctx, did)
	require.NoError(t, err)
	rec, err := b.engine.GetRecord(ctx, did, "app.bsky.feed.post", "p000003")
	require.NoError(t, err)
	q := url.Values{"did": {did.String()}, "cids": {head.Commit.String(), head.Data.String(), rec.CID.String(), rec.CID.String()}}
	resp, body = b.get(t, "com.atproto.sync.getBlocks", q)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.Equal(t, "application/vnd.ipld.car", resp.Header.Get("Content-Type"))
	got := readCARBlocks(t, body)
	require.Len(t, got, 3, "duplicates are sent once")
	require.Equal(t, head.CommitBytes, got[head.Commit.String()])
	require.Equal(t, rec.Data, got[rec.CID.String()])
	require.Contains(t, got, head.Data.String())
}

// readCARBlocks parses a CAR into CID → bytes, checking every block's
// hash. It reads the format by hand: getBlocks' CAR has no roots (as the
// reference PDS sends it), which go-car's reader refuses.
func readCARBlocks(t testing.TB, data []byte) map[string][]byte {
	t.Helper()
	br := bufio.NewReader(bytes.NewReader(data))
	hdr, err := util.LdRead(br)
	require.NoError(t, err)
	var h car.CarHeader
	require.NoError(t, cbor.DecodeInto(hdr, &h))
	require.Equal(t, uint64(1), h.Version)
	out := map[string][]byte{}
	for {
		c, data, err := util.ReadNode(br)
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		sum, err := c.Prefix().Sum(data)
		require.NoError(t, err)
		require.Equal(t, c, sum, "block bytes match their CID")
		out[c.String()] = data
	}
}

func TestAccountStatusAnswers(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	active := b.newAccount(t, "a-active", account.StatusActive)
	deact := b.newAccount(t, "b-deact", account.StatusActive)
	taken := b.newAccount(t, "c-taken", account.StatusActive)
	b.writePosts(t, deact, "p", 2)
	b.setStatus(t, deact, account.StatusDeactivated)
	b.setStatus(t, taken, account.StatusTakendown)

	for _, tc := range []struct {
		did  syntax.DID
		name string
	}{{deact, "RepoDeactivated"}, {taken, "RepoTakendown"}} {
		for _, m := range []string{"com.atproto.sync.getRepo", "com.atproto.sync.getLatestCommit", "com.atproto.sync.listBlobs"} {
			resp, body := b.get(t, m, url.Values{"did": {tc.did.String()}})
			requireXRPC(t, resp, body, http.StatusBadRequest, tc.name)
		}
		resp, body := b.get(t, "com.atproto.sync.getRecord", url.Values{"did": {tc.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {"p000000"}})
		requireXRPC(t, resp, body, http.StatusBadRequest, tc.name)
		resp, body = b.get(t, "com.atproto.sync.getBlob", url.Values{"did": {tc.did.String()}, "cid": {blob.ComputeCID([]byte("x")).String()}})
		requireXRPC(t, resp, body, http.StatusBadRequest, tc.name)
	}
	// A deleted account (no account row; its repo left behind) is not found.
	_, err := b.pool.Exec(context.Background(), "DELETE FROM accounts WHERE did = $1", active.String())
	require.NoError(t, err)
	resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {active.String()}})
	requireXRPC(t, resp, body, http.StatusBadRequest, "RepoNotFound")

	// getRepoStatus says what the status is instead of refusing.
	type status struct {
		Did    string  `json:"did"`
		Active bool    `json:"active"`
		Status *string `json:"status"`
		Rev    *string `json:"rev"`
	}
	resp, body = b.get(t, "com.atproto.sync.getRepoStatus", url.Values{"did": {deact.String()}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	var st status
	require.NoError(t, json.Unmarshal(body, &st))
	require.False(t, st.Active)
	require.Equal(t, "deactivated", *st.Status)
	require.Nil(t, st.Rev)

	live := b.newAccount(t, "d-live", account.StatusActive)
	resp, body = b.get(t, "com.atproto.sync.getRepoStatus", url.Values{"did": {live.String()}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	st = status{}
	require.NoError(t, json.Unmarshal(body, &st))
	require.True(t, st.Active)
	require.Nil(t, st.Status)
	require.NotNil(t, st.Rev)
}

func TestListRepos(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	var dids []string
	for i := range 7 {
		dids = append(dids, b.newAccount(t, fmt.Sprintf("user%02d", i), account.StatusActive).String())
	}
	b.setStatus(t, syntax.DID(dids[3]), account.StatusTakendown)
	_, err := b.pool.Exec(context.Background(), "DELETE FROM accounts WHERE did = $1", dids[5])
	require.NoError(t, err)

	type item struct {
		Did    string  `json:"did"`
		Head   string  `json:"head"`
		Rev    string  `json:"rev"`
		Active *bool   `json:"active"`
		Status *string `json:"status"`
	}
	var seen []item
	cursor := ""
	pages := 0
	for {
		q := url.Values{"limit": {"3"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		resp, body := b.get(t, "com.atproto.sync.listRepos", q)
		require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
		var page struct {
			Cursor *string `json:"cursor"`
			Repos  []item  `json:"repos"`
		}
		require.NoError(t, json.Unmarshal(body, &page))
		require.NotNil(t, page.Repos)
		seen = append(seen, page.Repos...)
		pages++
		if page.Cursor == nil {
			break
		}
		cursor = *page.Cursor
	}
	require.Equal(t, 3, pages)
	require.Len(t, seen, 7)
	for i, it := range seen {
		require.Equal(t, dids[i], it.Did)
		head, err := b.engine.GetHead(context.Background(), syntax.DID(it.Did))
		require.NoError(t, err)
		require.Equal(t, head.Commit.String(), it.Head)
		require.Equal(t, head.Rev, it.Rev)
		require.NotNil(t, it.Active)
		switch i {
		case 3:
			require.False(t, *it.Active)
			require.Equal(t, "takendown", *it.Status)
		case 5:
			require.False(t, *it.Active)
			require.Equal(t, "deleted", *it.Status, "a repo left by a deleted account")
		default:
			require.True(t, *it.Active)
			require.Nil(t, it.Status)
		}
	}
	require.True(t, strings.HasPrefix(seen[0].Head, "bafyrei"))
}

// TestCARCacheBoundsEntries: small repositories' files are each charged
// at least carEntryMin, so the cache's entries (and their memory) are
// bounded by its size, not by the number of repositories served.
func TestCARCacheBoundsEntries(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{carCache: true, configure: func(c *config.Config) { c.CARCache = 3 * carEntryMin }})
	for i := range 8 {
		did := b.newAccount(t, fmt.Sprintf("small%d", i), account.StatusActive)
		b.writePosts(t, did, "a", 2) // a CAR of well under a kilobyte
		resp, body := b.get(t, "com.atproto.sync.getRepo", url.Values{"did": {did.String()}})
		require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	}
	cache := b.server.carCache
	cache.mu.Lock()
	kept := cache.lru.Len()
	cache.mu.Unlock()
	require.Equal(t, 3, kept)
}
