package pds

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipld/go-car"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/limits"
	"github.com/bulwark-pds/bulwark/priority"
	"github.com/bulwark-pds/bulwark/repo"
)

// exportRecords is enough records for a CAR export of several 64 KiB
// chunks (about 130 bytes per post and its share of the MST).
const exportRecords = 1200

// priorityEnv is a server whose priority gate the test holds, with one
// account of exportRecords posts.
func priorityEnv(t *testing.T, gate *priority.Gate) (*accountEnv, *user) {
	t.Helper()
	e := newAccountEnv(t, envOptions{options: func(o *Options) { o.Priority = gate }})
	u := e.createUser(t)
	for start := 0; start < exportRecords; start += limits.MaxCommitOps {
		var writes []repo.Write
		for i := start; i < min(exportRecords, start+limits.MaxCommitOps); i++ {
			writes = append(writes, repo.Write{
				Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
				RKey: syntax.RecordKey(fmt.Sprintf("3kexport%06d", i)), Record: post(fmt.Sprint("post ", i)),
			})
		}
		// Through the engine, not HTTP: these are setup, not foreground
		// work of the test.
		_, err := e.engine.Apply(context.Background(), u.did, writes, nil)
		require.NoError(t, err)
	}
	return e, u
}

type exportResult struct {
	status int
	body   []byte
	err    error
}

// startExport begins a getRepo of did. headers receives once the response
// headers arrived (which happens with the first chunk: the handler sends
// nothing before it), result once the body was read.
func startExport(ctx context.Context, base string, did syntax.DID) (headers <-chan struct{}, result <-chan exportResult) {
	h := make(chan struct{})
	res := make(chan exportResult, 1)
	go func() {
		u := base + "/xrpc/com.atproto.sync.getRepo?" + url.Values{"did": {did.String()}}.Encode()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			res <- exportResult{err: err}
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			res <- exportResult{err: err}
			return
		}
		defer resp.Body.Close()
		close(h)
		b, err := io.ReadAll(resp.Body)
		res <- exportResult{status: resp.StatusCode, body: b, err: err}
	}()
	return h, res
}

// requireWholeCAR checks an export: a CAR whose root is the repository's
// latest commit, holding at least every record.
func requireWholeCAR(t *testing.T, e *accountEnv, did syntax.DID, got exportResult) {
	t.Helper()
	require.NoError(t, got.err)
	require.Equal(t, http.StatusOK, got.status, "body: %.300s", got.body)
	require.Greater(t, len(got.body), 2*streamBuffer, "the export must span several chunks for the test to mean anything")
	latest := e.get(t, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {did.String()}}).ok(t).str(t, "cid")
	cr, err := car.NewCarReader(bytes.NewReader(got.body))
	require.NoError(t, err)
	require.Len(t, cr.Header.Roots, 1)
	require.Equal(t, latest, cr.Header.Roots[0].String())
	blocks := 0
	for {
		_, err := cr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		blocks++
	}
	require.Greater(t, blocks, exportRecords)
}

// TestExportWaitsForWriteInFlight: writes are foreground work (createRecord
// enters the gate); a getRepo export that starts while a write is in
// flight sends nothing until the write leaves, then completes whole. The
// gate's pause bound is an hour here, so only the write leaving can
// release the export.
func TestExportWaitsForWriteInFlight(t *testing.T) {
	t.Parallel()
	gate := priority.New(priority.Config{MaxPause: time.Hour})
	e, u := priorityEnv(t, gate)

	// A commit is foreground: createRecord enters the gate, and leaves it.
	before := gate.Stats().Entered
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "3kforeground", "record": post("foreground"),
	}).ok(t)
	require.Equal(t, before+1, gate.Stats().Entered)
	require.Zero(t, gate.Stats().InFlight)
	// So do the other writes' commits.
	for nsid, in := range map[string]map[string]any{
		"com.atproto.repo.putRecord": {"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "3kforeground", "record": post("again")},
		"com.atproto.repo.applyWrites": {"repo": u.did, "writes": []any{map[string]any{
			"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "value": post("batch"),
		}}},
		"com.atproto.repo.deleteRecord": {"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "3kforeground"},
	} {
		before := gate.Stats().Entered
		e.post(t, nsid, u.access, in).ok(t)
		require.Equal(t, before+1, gate.Stats().Entered, nsid)
	}
	// A write refused before its commit (bad input, no session) holds
	// nothing back: only the commit is foreground work.
	for _, nsid := range []string{"com.atproto.repo.createRecord", "com.atproto.repo.putRecord", "com.atproto.repo.deleteRecord", "com.atproto.repo.applyWrites"} {
		before := gate.Stats().Entered
		e.post(t, nsid, u.access, map[string]any{})
		e.post(t, nsid, "", map[string]any{"repo": u.did})
		require.Equal(t, before, gate.Stats().Entered, nsid)
	}
	// Reads are not.
	before = gate.Stats().Entered
	e.get(t, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {u.did.String()}}).ok(t)
	require.Equal(t, before, gate.Stats().Entered)

	// A write in flight (held by the test, as a slow createRecord would
	// be) holds the export back before its first chunk.
	leave := gate.Enter()
	headers, result := startExport(context.Background(), e.url, u.did)
	require.Eventually(t, func() bool { return gate.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
	select {
	case <-headers:
		t.Fatal("the export sent a chunk while a write was in flight")
	case r := <-result:
		t.Fatalf("the export ended while a write was in flight: %v", r.err)
	default:
	}
	require.Zero(t, gate.Stats().Waits, "no pause has ended yet")

	leave()
	got := <-result
	requireWholeCAR(t, e, u.did, got)
	st := gate.Stats()
	require.Zero(t, st.Waiting)
	require.Zero(t, st.InFlight)
	require.GreaterOrEqual(t, st.Waits, uint64(1))
	require.Zero(t, st.Timeouts, "only the write leaving released the export")
}

// TestExportNotStarvedByWrites: with a write in flight for the whole
// export, the bounded pause still lets the export through, a chunk per
// pause.
func TestExportNotStarvedByWrites(t *testing.T) {
	t.Parallel()
	gate := priority.New(priority.Config{MaxPause: time.Millisecond})
	e, u := priorityEnv(t, gate)
	leave := gate.Enter()
	defer leave()
	_, result := startExport(context.Background(), e.url, u.did)
	requireWholeCAR(t, e, u.did, <-result)
	st := gate.Stats()
	require.GreaterOrEqual(t, st.Timeouts, uint64(2), "one pause per chunk, each ended by the bound")
	require.Equal(t, st.Waits, st.Timeouts)
}

// TestPausedExportEndsWithItsClient: a client that goes away while its
// export is paused ends the export (and frees its slot) without waiting
// for the write.
func TestPausedExportEndsWithItsClient(t *testing.T) {
	t.Parallel()
	gate := priority.New(priority.Config{MaxPause: time.Hour})
	e := newAccountEnv(t, envOptions{options: func(o *Options) { o.Priority = gate }})
	u := e.createUser(t)
	leave := gate.Enter()
	defer leave()
	ctx, cancel := context.WithCancel(context.Background())
	_, result := startExport(ctx, e.url, u.did)
	require.Eventually(t, func() bool { return gate.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.Error(t, (<-result).err)
	require.Eventually(t, func() bool { return gate.Stats().Waiting == 0 }, 10*time.Second, time.Millisecond)
	require.Zero(t, gate.Stats().Timeouts)
	// The export slot is free again: another export (with the write
	// still in flight, so it pauses) gets as far as the gate.
	_, result = startExport(context.Background(), e.url, u.did)
	require.Eventually(t, func() bool { return gate.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
	leave()
	got := <-result
	require.NoError(t, got.err)
	require.Equal(t, http.StatusOK, got.status)
}

// TestBackgroundMaxPauseOption: the gate New makes takes its bound from
// Options, else from the configuration, and reports its pauses in the
// metrics.
func TestBackgroundMaxPauseOption(t *testing.T) {
	t.Parallel()
	// New does not connect; a pool that never will is enough.
	pool, err := pgxpool.New(context.Background(), "postgres://bulwark@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	newServer := func(cfgPause, optPause time.Duration) *Server {
		cfg := config.DefaultConfig()
		cfg.BackgroundMaxPause = cfgPause
		s, err := New(Options{Config: cfg, DB: pool, BackgroundMaxPause: optPause})
		require.NoError(t, err)
		return s
	}
	require.Equal(t, config.DefaultBackgroundMaxPause, newServer(config.DefaultBackgroundMaxPause, 0).Priority().MaxPause())
	require.Equal(t, 40*time.Millisecond, newServer(40*time.Millisecond, 0).Priority().MaxPause())
	require.Zero(t, newServer(0, 0).Priority().MaxPause(), "configured 0: never pause")
	require.Zero(t, newServer(40*time.Millisecond, -1).Priority().MaxPause(), "negative option: never pause")
	require.Equal(t, 2*time.Millisecond, newServer(40*time.Millisecond, 2*time.Millisecond).Priority().MaxPause())

	s := newServer(0, time.Millisecond)
	const series = "bulwark_priority_background_pause_timeouts_total"
	before := scrape(t)
	leave := s.Priority().Enter()
	require.NoError(t, s.Priority().Yield(context.Background()))
	leave()
	after := scrape(t)
	require.GreaterOrEqual(t, after[series], before[series]+1)
	require.GreaterOrEqual(t, after["bulwark_priority_background_pauses_total"], before["bulwark_priority_background_pauses_total"]+1)
	require.Greater(t, after["bulwark_priority_background_pause_seconds_total"], before["bulwark_priority_background_pause_seconds_total"])
}
