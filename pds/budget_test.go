package pds

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/repo"
)

// tracedPool is a fresh test database whose pool counts every statement.
func tracedPool(t *testing.T) (*pgxpool.Pool, *countingTracer) {
	t.Helper()
	tr := &countingTracer{}
	pcfg, err := pgxpool.ParseConfig(dbtest.NewURL(t))
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, tr
}

// fetch is an HTTP request made from a goroutine (no require there).
type fetched struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func fetch(method, u string) fetched {
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		return fetched{err: err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fetched{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fetched{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// TestFullBudgetQueueRefusesWithoutWork: with the byte budget taken and its
// wait queue full, every expensive read (getRepo, also as HEAD; sync
// proofs; block lists) is answered 503 ServiceOverloaded with Retry-After
// at once, and the database sees not one statement. The request that was
// queued is served once the budget frees up.
func TestFullBudgetQueueRefusesWithoutWork(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, tr := tracedPool(t)
	const capacity = 4 << 20
	b := budget.New(budget.Config{Capacity: capacity, MaxQueue: 1, RetryAfter: 7 * time.Second})
	e := newAccountEnv(t, envOptions{pool: pool, options: func(o *Options) {
		o.Budget = b
		o.ExportSlots = -1 // this test is about bytes, not export slots
	}})
	u := e.createUser(t)
	c := e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "3aaaaaaaaaaa2", "record": post("hello"),
	}).ok(t).json(t)

	hold, err := b.Acquire(ctx, capacity)
	require.NoError(t, err)
	defer hold.Release()
	// Every request above has been answered, and a handler runs all its
	// statements before its answer goes out (nothing runs in the
	// background here: no sequencer), so the count is still.
	before := tr.n.Load()

	repoURL := e.url + "/xrpc/com.atproto.sync.getRepo?" + url.Values{"did": {u.did.String()}}.Encode()
	queued := make(chan fetched, 1)
	go func() { queued <- fetch(http.MethodGet, repoURL) }()
	require.Eventually(t, func() bool { return b.Stats().QueueLen == 1 }, 10*time.Second, time.Millisecond)

	did := u.did.String()
	for _, tc := range []struct {
		method, nsid string
		q            url.Values
	}{
		{http.MethodGet, "com.atproto.sync.getRepo", url.Values{"did": {did}}},
		{http.MethodHead, "com.atproto.sync.getRepo", url.Values{"did": {did}}},
		{http.MethodGet, "com.atproto.sync.getRecord", url.Values{"did": {did}, "collection": {"app.bsky.feed.post"}, "rkey": {"3aaaaaaaaaaa2"}}},
		{http.MethodGet, "com.atproto.sync.getBlocks", url.Values{"did": {did}, "cids": {c["cid"].(string)}}},
	} {
		res := e.do(t, tc.method, tc.nsid, "", nil, tc.q, nil)
		require.Equal(t, http.StatusServiceUnavailable, res.status, "%s %s: %s", tc.method, tc.nsid, res.body)
		require.Equal(t, []string{"7"}, res.header.Values("Retry-After"), "%s %s", tc.method, tc.nsid)
		if tc.method == http.MethodGet {
			res.fails(t, http.StatusServiceUnavailable, "ServiceOverloaded")
		}
	}
	require.Equal(t, before, tr.n.Load(), "refused and queued requests ran no statement")
	require.EqualValues(t, 4, b.Stats().Rejected)

	hold.Release()
	got := <-queued
	require.NoError(t, got.err)
	require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
	require.Equal(t, carContentType, got.header.Get("Content-Type"))
	require.NotEmpty(t, got.body)
	require.Greater(t, tr.n.Load(), before)
	require.Eventually(t, func() bool { return b.Stats().InUse == 0 }, 10*time.Second, time.Millisecond, "every reservation released")
}

// TestClientGoneLeavesQueue: a client that gives up while its request
// waits for the budget leaves the queue at once (the next waiter is not
// held up behind it), and the request is recorded as 499, not as a server
// error.
func TestClientGoneLeavesQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := budget.New(budget.Config{Capacity: 4 << 20})
	e := newAccountEnv(t, envOptions{options: func(o *Options) { o.Budget = b }})
	u := e.createUser(t)
	hold, err := b.Acquire(ctx, 4<<20)
	require.NoError(t, err)
	defer hold.Release()
	series := `bulwark_http_requests_total{method="com.atproto.sync.getRepo",status="499"}`
	before := scrape(t)[series]

	reqCtx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, e.url+"/xrpc/com.atproto.sync.getRepo?"+url.Values{"did": {u.did.String()}}.Encode(), nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return b.Stats().QueueLen == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Eventually(t, func() bool { return b.Stats().QueueLen == 0 && b.Stats().Canceled == 1 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return scrape(t)[series] >= before+1 }, 10*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, b.Stats().Admitted, "only the test's own hold was admitted")
}

// TestExportSlotsBoundConcurrentGetRepo: getRepo exports hold a Postgres
// connection each, so they take a slot first; with the slots taken and no
// waiting allowed, the next export is refused at once instead of queueing
// for the pool in front of every other request.
func TestExportSlotsBoundConcurrentGetRepo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := budget.New(budget.Config{Capacity: 4 << 20, MaxQueue: 4})
	e := newAccountEnv(t, envOptions{
		configure: func(c *config.Config) { c.InflightQueue = 0 },
		options: func(o *Options) {
			o.Budget = b
			o.ExportSlots = 1
		},
	})
	u := e.createUser(t)
	hold, err := b.Acquire(ctx, 4<<20)
	require.NoError(t, err)
	defer hold.Release()

	repoURL := e.url + "/xrpc/com.atproto.sync.getRepo?" + url.Values{"did": {u.did.String()}}.Encode()
	first := make(chan fetched, 1)
	// The first export takes the only slot, then waits for bytes.
	go func() { first <- fetch(http.MethodGet, repoURL) }()
	require.Eventually(t, func() bool { return b.Stats().QueueLen == 1 }, 10*time.Second, time.Millisecond)

	e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {u.did.String()}}).fails(t, http.StatusServiceUnavailable, "ServiceOverloaded")
	// Other reads do not need an export slot.
	e.get(t, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {u.did.String()}}).ok(t)

	hold.Release()
	got := <-first
	require.NoError(t, got.err)
	require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
	e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {u.did.String()}}).ok(t)
}

// TestLargerThanBudgetNotStarved: a getRepo whose reservation exceeds the
// whole budget arrives first, small proof reads queue behind it; when the
// budget drains, the large one is admitted alone and every request behind
// it is then served. (Strict FIFO order and the absence of overtaking are
// proven by the budget package's own tests; this checks the handlers
// release what they take.)
func TestLargerThanBudgetNotStarved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const capacity = 1 << 20 // smaller than getRepoReserve
	b := budget.New(budget.Config{Capacity: capacity})
	e := newAccountEnv(t, envOptions{options: func(o *Options) { o.Budget = b }})
	u := e.createUser(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "3aaaaaaaaaaa2", "record": post("hello"),
	}).ok(t)

	hold, err := b.Acquire(ctx, capacity)
	require.NoError(t, err)
	defer hold.Release()
	did := u.did.String()
	results := make(chan fetched, 4)
	go func() {
		results <- fetch(http.MethodGet, e.url+"/xrpc/com.atproto.sync.getRepo?"+url.Values{"did": {did}}.Encode())
	}()
	require.Eventually(t, func() bool { return b.Stats().QueueLen == 1 }, 10*time.Second, time.Millisecond)
	proof := e.url + "/xrpc/com.atproto.sync.getRecord?" + url.Values{"did": {did}, "collection": {"app.bsky.feed.post"}, "rkey": {"3aaaaaaaaaaa2"}}.Encode()
	for i := range 3 {
		go func() { results <- fetch(http.MethodGet, proof) }()
		require.Eventually(t, func() bool { return b.Stats().QueueLen == 2+i }, 10*time.Second, time.Millisecond)
	}
	hold.Release()
	for range 4 {
		got := <-results
		require.NoError(t, got.err)
		require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
	}
	st := b.Stats()
	require.Zero(t, st.QueueLen)
	require.Zero(t, st.Rejected)
	require.EqualValues(t, 4, st.Waited)
}

// discard is a ResponseWriter that keeps nothing, so that a measured
// handler's heap is its own and not a buffered response's.
type discard struct {
	h http.Header
	n int64
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(p []byte) (int, error) { d.n += int64(len(p)); return len(p), nil }

// BenchmarkReservationHeap measures, with budget.MeasureHeap, the peak heap
// of each kind of expensive response, served by the real handler into a
// writer that keeps nothing: the figures the reservations in limits.go are
// sized from (docs/BENCHMARKS.md, "Reservations measured").
//
//	go test ./pds -run '^$' -bench BenchmarkReservationHeap -benchtime 1x
func BenchmarkReservationHeap(b *testing.B) {
	sb := syncSetup(b, syncOptions{configure: func(c *config.Config) { c.ExportRate = 0 }})
	cfg := config.DefaultConfig()
	cfg.DataDir = b.TempDir()
	require.NoError(b, cfg.Finalize())
	// No accounts service: the handlers skip the status check, one query
	// less in the figures.
	s, err := New(Options{Config: cfg, DB: sb.pool, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Repo: sb.engine, Blobs: sb.blobs})
	require.NoError(b, err)
	h := s.Handler()
	serve := func(method, nsid string, q url.Values) (int64, budget.HeapCost) {
		req := httptest.NewRequest(method, "/xrpc/"+nsid+"?"+q.Encode(), nil)
		var out int64
		cost := budget.MeasureHeap(func() any {
			w := &discard{h: http.Header{}}
			h.ServeHTTP(w, req)
			out = w.n
			return nil
		})
		return out, cost
	}
	report := func(name string, size int64, c budget.HeapCost) {
		b.Logf("%-28s size %10d B  peak %9d B  (%.2f B/B)  allocated %10d B", name, size, c.Peak, float64(c.Peak)/float64(max(size, 1)), c.Allocated)
	}

	for _, n := range []int{2_000, 20_000} {
		did := sb.newAccount(b, fmt.Sprintf("heap%d", n), account.StatusActive)
		sb.writePosts(b, did, "3aaa", n)
		q := url.Values{"did": {did.String()}}
		serve(http.MethodGet, "com.atproto.sync.getRepo", q) // warm caches and pools
		size, c := serve(http.MethodGet, "com.atproto.sync.getRepo", q)
		report(fmt.Sprintf("getRepo %d records", n), size, c)
		size, c = serve(http.MethodGet, "com.atproto.sync.getRecord", url.Values{"did": {did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {"3aaa000100"}})
		report("sync.getRecord proof", size, c)
	}

	did := sb.newAccount(b, "heapblob", account.StatusActive)
	sb.as(did)
	for _, n := range []int{256 << 10, 4 << 20} {
		data := randomBytes(b, n)
		ref := sb.uploadOK(b, did, data, "application/octet-stream")
		require.NoError(b, sb.postBlobs(b, did, fmt.Sprintf("b%d", n), ref))
		q := url.Values{"did": {did.String()}, "cid": {ref.Ref.String()}}
		serve(http.MethodGet, "com.atproto.sync.getBlob", q)
		size, c := serve(http.MethodGet, "com.atproto.sync.getBlob", q)
		report(fmt.Sprintf("getBlob %d KiB", n>>10), size, c)
	}

	for _, n := range []int{100 << 10, 900 << 10} {
		rec := blockOfSize(b, "com.example.big", n, "big")
		res, err := sb.engine.Apply(context.Background(), did, []repo.Write{{
			Action: repo.ActionCreate, Collection: "com.example.big", RKey: syntax.RecordKey(fmt.Sprint("r", n)), Record: rec,
		}}, nil)
		require.NoError(b, err)
		cid := res.Results[0].CID.String()
		size, c := serve(http.MethodGet, "com.atproto.sync.getBlocks", url.Values{"did": {did.String()}, "cids": {cid}})
		report(fmt.Sprintf("getBlocks 1 × %d KiB", n>>10), size, c)
		// repo.getRecord resolves the repo through the accounts service,
		// which this server lacks: measure its work (read, decode, encode)
		// directly.
		cost := budget.MeasureHeap(func() any {
			r, err := sb.engine.GetRecord(context.Background(), did, "com.example.big", syntax.RecordKey(fmt.Sprint("r", n)))
			if err != nil {
				return err
			}
			out, err := recordJSON(did, r)
			if err != nil {
				return err
			}
			data, err := json.Marshal(out)
			if err != nil {
				return err
			}
			return len(data)
		})
		report(fmt.Sprintf("getRecord JSON %d KiB", n>>10), int64(n), cost)
	}
	for range b.N {
		// The figures are logged above; there is nothing to repeat.
	}
}
