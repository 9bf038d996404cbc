package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// slowImport is an importRepo whose body the test sends by hand.
type slowImport struct {
	body     *io.PipeWriter
	answered chan xrpcResult
}

// startImport posts an importRepo to base as token, with a body the test
// writes through the returned slowImport (its first bytes, head, at once).
// A header X-Import names the request for the server's wrapper.
func startImport(t *testing.T, base, token, name string, head []byte) *slowImport {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, base+"/xrpc/com.atproto.repo.importRepo", pr)
	require.NoError(t, err)
	req.Header.Set("Content-Type", carContentType)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Import", name)
	si := &slowImport{body: pw, answered: make(chan xrpcResult, 1)}
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			si.answered <- xrpcResult{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		si.answered <- xrpcResult{status: resp.StatusCode, header: resp.Header, body: b}
	}()
	go func() { _, _ = pw.Write(head) }()
	t.Cleanup(func() { pw.CloseWithError(io.ErrUnexpectedEOF) })
	return si
}

// readSignals serves h with a wrapper that closes the channel named by a
// request's X-Import header when the handler first reads that request's
// body, which an import does once it holds a slot.
type readSignals struct {
	mu    sync.Mutex
	chans map[string]chan struct{}
}

func (rs *readSignals) reading(name string) chan struct{} {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.chans[name] == nil {
		rs.chans[name] = make(chan struct{})
	}
	return rs.chans[name]
}

func (rs *readSignals) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := r.Header.Get("X-Import"); name != "" {
			ch := rs.reading(name)
			var once sync.Once
			r.Body = readCloser{&firstRead{r: r.Body, first: func() { once.Do(func() { close(ch) }) }}, r.Body}
		}
		h.ServeHTTP(w, r)
	})
}

// TestSlowImportsOfOneAccountLeaveSlots: with two import slots, an
// account running a slow import gets 429 for a second one, which takes
// no slot, and another account's import meanwhile succeeds. (With slots
// shared first come, first served, the second slow import took the last
// slot and the other account's import was refused with 503.)
func TestSlowImportsOfOneAccountLeaveSlots(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{blobs: true, configure: func(c *config.Config) { c.ImportSlots = 2 }})
	signals := &readSignals{chans: map[string]chan struct{}{}}
	ts := httptest.NewServer(signals.wrap(e.server.Handler()))
	t.Cleanup(ts.Close)
	mallory, bob := e.createUser(t), e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	malloryCAR := repotest.RepoCAR(t, mallory.did, oldKey, importOldRev, importPosts(5))
	head := malloryCAR[:len(malloryCAR)/2]

	first := startImport(t, ts.URL, mallory.access, "first", head)
	select {
	case <-signals.reading("first"):
	case res := <-first.answered:
		t.Fatalf("the first slow import was answered: %d %s", res.status, res.body)
	case <-time.After(30 * time.Second):
		t.Fatal("the first slow import never started reading")
	}
	second := startImport(t, ts.URL, mallory.access, "second", head)
	var refused xrpcResult
	select {
	case refused = <-second.answered:
	case <-signals.reading("second"):
		t.Log("the second slow import of the same account took a slot")
	case <-time.After(30 * time.Second):
		t.Fatal("the second slow import was neither answered nor read")
	}

	bobCAR := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(3))
	e.postCAR(t, bob.access, bobCAR).ok(t)
	require.Equal(t, 3, e.postCount(t, bob.did))

	msg := refused.fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	require.Contains(t, msg, "already running")
	require.NotEmpty(t, refused.header.Get("Retry-After"))
	select {
	case res := <-first.answered:
		t.Fatalf("the first slow import was answered: %d %s", res.status, res.body)
	default:
	}
}

// postCount counts did's posts, as listRecords lists them.
func (e *accountEnv) postCount(t *testing.T, did syntax.DID) int {
	t.Helper()
	res := e.get(t, "com.atproto.repo.listRecords", "", url.Values{"repo": {did.String()}, "collection": {"app.bsky.feed.post"}, "limit": {"100"}}).ok(t)
	var out struct {
		Records []json.RawMessage `json:"records"`
	}
	require.NoError(t, json.Unmarshal(res.body, &out))
	return len(out.Records)
}

// postCAR imports car into the account of token.
func (e *accountEnv) postCAR(t *testing.T, token string, car []byte) xrpcResult {
	t.Helper()
	return e.do(t, http.MethodPost, "com.atproto.repo.importRepo", token, bytes.NewReader(car), nil, carHeader)
}

// TestImportBodyDeadline: an import body that keeps coming, fast enough
// for the rate, is cut off at --import-deadline with a 400 saying so, and
// nothing is stored.
func TestImportBodyDeadline(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{blobs: true, configure: func(c *config.Config) {
		c.ImportDeadline = 2 * time.Second
		c.ImportMinRate = 1
	}})
	bob := e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	car := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(200))
	before := importState(t, e)

	si := startImport(t, e.url, bob.access, "slow", car[:64])
	res := si.trickle(t, car[64:], 512, 100*time.Millisecond, 20*time.Second)
	require.NotNil(t, res, "the import was not cut off")
	msg := res.fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Contains(t, msg, "must arrive within 2s")
	require.Equal(t, before, importState(t, e))
}

// TestImportMinRate: an import body arriving above the rate of other long
// bodies but below --import-min-rate is cut off once its grace period is
// over.
func TestImportMinRate(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{
		blobs:     true,
		configure: func(c *config.Config) { c.ImportMinRate = 64 << 10 },
		options:   func(o *Options) { o.bodyRate = &bodyRate{grace: 300 * time.Millisecond, rate: 4 << 10} },
	})
	bob := e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	car := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(2000))
	require.Greater(t, len(car), 100<<10)

	// 1 KiB every 64 ms is 16 KiB a second: four times the rate of other
	// bodies, a quarter of the import rate.
	si := startImport(t, e.url, bob.access, "slow", car[:64])
	res := si.trickle(t, car[64:], 1<<10, 64*time.Millisecond, 20*time.Second)
	require.NotNil(t, res, "the import was not cut off")
	msg := res.fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Contains(t, msg, "below 65536 bytes a second")
}

// trickle writes rest in chunks of size every interval until the server
// answers, and returns its answer; nil when it has not answered within
// giveUp (the body is then abandoned).
func (si *slowImport) trickle(t *testing.T, rest []byte, size int, interval, giveUp time.Duration) *xrpcResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), giveUp)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for len(rest) > 0 {
		select {
		case res := <-si.answered:
			return &res
		case <-ctx.Done():
			return nil
		case <-tick.C:
			n := min(size, len(rest))
			if _, err := si.body.Write(rest[:n]); err != nil {
				res := <-si.answered
				return &res
			}
			rest = rest[n:]
		}
	}
	select {
	case res := <-si.answered:
		return &res
	case <-ctx.Done():
		return nil
	}
}

// limitedImportEnv is a server whose importRepo limit is on (the test
// servers run without rate limits).
func limitedImportEnv(t *testing.T) *accountEnv {
	t.Helper()
	return newAccountEnv(t, envOptions{blobs: true, options: func(o *Options) {
		set, err := ratelimit.NewSet(map[string][]ratelimit.Rule{
			ratelimit.PolicyImportRepo: {{Name: "hour", Limit: 2, Window: time.Hour}},
		}, 0)
		require.NoError(t, err)
		o.Limits = set
	}})
}

// TestImportRepoRateLimit: importRepo is limited per account: past the
// limit a started import is refused with 429 before its body is read, and
// another account still imports.
func TestImportRepoRateLimit(t *testing.T) {
	t.Parallel()
	e := limitedImportEnv(t)
	bob, carol := e.createUser(t), e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	car := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(2))
	for range 2 {
		e.postCAR(t, bob.access, car).ok(t)
	}
	msg := e.postCAR(t, bob.access, car).fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	require.True(t, strings.Contains(msg, ratelimit.PolicyImportRepo), msg)
	e.postCAR(t, carol.access, repotest.RepoCAR(t, carol.did, oldKey, importOldRev, importPosts(2))).ok(t)
}

// TestImportOutlastsBodyGrace: an import whose CAR arrives at once but
// takes longer to store than the body's grace period succeeds: the body's
// read deadline must not outlive the body (it would fire during the
// import and cancel it).
func TestImportOutlastsBodyGrace(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{
		blobs:   true,
		options: func(o *Options) { o.bodyRate = &bodyRate{grace: 300 * time.Millisecond, rate: 4 << 10} },
	})
	bob := e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	car := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(20000))
	start := time.Now()
	e.postCAR(t, bob.access, car).ok(t)
	t.Logf("imported %d bytes in %s", len(car), time.Since(start))
	require.Equal(t, 100, e.postCount(t, bob.did), "a page of the 20000")

	// Chunked (no Content-Length): the end of the body is a read of its
	// own.
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write(car); pw.Close() }()
	start = time.Now()
	e.do(t, http.MethodPost, "com.atproto.repo.importRepo", bob.access, pr, nil, carHeader).ok(t)
	t.Logf("imported %d bytes, chunked, in %s", len(car), time.Since(start))
}
