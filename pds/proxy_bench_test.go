package pds

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/proxy"
)

// profileJSON is an app view getProfile answer of ordinary size (~1 KB).
var profileJSON = []byte(`{"did":"did:plc:someoneelse234567abcdef","handle":"someone.test","displayName":"Someone",` +
	`"description":"` + strings.Repeat("about me ", 80) + `","followersCount":10,"followsCount":20,"postsCount":30,` +
	`"indexedAt":"2024-01-01T00:00:00.000Z"}`)

// BenchmarkProxyOverhead measures what Bulwark adds to an app view read:
// each iteration GETs a ~1 KB getProfile answer from a local upstream
// directly, then the same through Bulwark's full XRPC stack with a
// session (access-token check against Postgres, a service token minted
// and signed, the guarded outbound transport, the relay), and reports
// the median and 99th percentile of each and the difference of the
// medians. Interleaving the two keeps a busy machine's noise out of the
// difference.
//
//	go test ./pds -run '^$' -bench BenchmarkProxyOverhead -benchtime 2000x
func BenchmarkProxyOverhead(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(profileJSON)
	}))
	b.Cleanup(up.Close)
	// The in-flight budget serve sizes for a 1 GiB machine: a proxied
	// request reserves from it (and from its pool) as in production.
	e := newProxyEnv(b, proxyEnvOptions{
		configure: func(c *config.Config) { c.AppViewURL, c.AppViewDID = up.URL, "did:web:appview.bench.test" },
		options:   func(o *Options) { o.Budget = budget.New(budget.Config{Capacity: 256 << 20}) },
	})
	u := e.createUser(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	fetch := func(url, token string) time.Duration {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		require.NoError(b, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := client.Do(req)
		require.NoError(b, err)
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		elapsed := time.Since(start)
		require.NoError(b, err)
		require.Equal(b, http.StatusOK, resp.StatusCode)
		require.Equal(b, int64(len(profileJSON)), n)
		return elapsed
	}
	path := "/xrpc/app.bsky.actor.getProfile?actor=someone.test"
	for range 50 { // warm connections, key cache, DID caches
		fetch(up.URL+path, "")
		fetch(e.url+path, u.access)
	}
	var direct, proxied []time.Duration
	for b.Loop() {
		direct = append(direct, fetch(up.URL+path, ""))
		proxied = append(proxied, fetch(e.url+path, u.access))
	}
	pct := func(d []time.Duration, p int) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)*p/100].Microseconds())
	}
	b.ReportMetric(pct(direct, 50), "direct-p50-µs")
	b.ReportMetric(pct(direct, 99), "direct-p99-µs")
	b.ReportMetric(pct(proxied, 50), "proxied-p50-µs")
	b.ReportMetric(pct(proxied, 99), "proxied-p99-µs")
	b.ReportMetric(pct(proxied, 50)-pct(direct, 50), "overhead-p50-µs")
}

// BenchmarkProxyHeap measures, with budget.MeasureHeap, the heap a
// proxied request holds, served by the real handler into a writer that
// keeps nothing: the figures proxyReserve and proxyHeldFactor are sized
// from. Relayed: 32 concurrent 4 MiB answers, per request. Buffered for
// read-after-write: one timeline of each size, per byte, plain and
// gzipped.
//
//	go test ./pds -run '^$' -bench BenchmarkProxyHeap -benchtime 1x
func BenchmarkProxyHeap(b *testing.B) {
	ctx := context.Background()
	stream := bytes.Repeat([]byte("0123456789abcdef"), (4<<20)/16)
	bodies := map[string][]byte{"stream": stream}
	sizes := []int{64 << 10, 256 << 10, 1 << 20, 4 << 20}
	for _, n := range sizes {
		plain := timeline(n)
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		_, _ = zw.Write(plain)
		require.NoError(b, zw.Close())
		bodies[fmt.Sprint("plain", n)], bodies[fmt.Sprint("gzip", n)] = plain, gz.Bytes()
	}
	var seen atomic.Pointer[string]
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("body")
		w.Header().Set("Content-Type", "application/json")
		if name != "stream" {
			w.Header().Set("Atproto-Repo-Rev", *seen.Load())
		}
		if strings.HasPrefix(name, "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
		}
		_, _ = w.Write(bodies[name])
	}))
	b.Cleanup(up.Close)
	e := newProxyEnv(b, proxyEnvOptions{configure: func(c *config.Config) { c.AppViewURL = up.URL }})
	u := e.createUser(b)
	e.post(b, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("old")}).ok(b)
	rev, err := e.engine.Rev(ctx, u.did)
	require.NoError(b, err)
	seen.Store(&rev)
	e.post(b, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("new")}).ok(b)

	h := e.server.Handler()
	serve := func(body, encoding string) *discard {
		req := httptest.NewRequest(http.MethodGet, "/xrpc/app.bsky.feed.getTimeline?body="+body, nil)
		req.Header.Set("Authorization", "Bearer "+u.access)
		if encoding != "" {
			req.Header.Set("Accept-Encoding", encoding)
		}
		w := &discard{h: http.Header{}}
		h.ServeHTTP(w, req)
		return w
	}
	report := func(name string, per int64, c budget.HeapCost) {
		b.Logf("%-28s peak %10d B  per unit %9.0f B  (unit %d B: %.2f B/B)", name, c.Peak, float64(c.Peak)/float64(max(per, 1)), per, float64(c.Peak)/float64(max(per, 1)))
	}

	serve("stream", "")
	const streams = 32
	c := budget.MeasureHeap(func() any {
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() { serve("stream", "") })
		}
		wg.Wait()
		return nil
	})
	b.Logf("relayed: %d × 4 MiB, peak %d B, %d B per request", streams, c.Peak, c.Peak/streams)
	for _, n := range sizes {
		for _, enc := range []string{"plain", "gzip"} {
			name := fmt.Sprint(enc, n)
			accept := ""
			if enc == "gzip" {
				accept = "gzip"
			}
			serve(name, accept)
			var w *discard
			c := budget.MeasureHeap(func() any { w = serve(name, accept); return nil })
			require.NotEmpty(b, w.h.Get("Atproto-Upstream-Lag"), name)
			report(fmt.Sprintf("buffered %s %d KiB", enc, n>>10), int64(len(bodies[name])), c)
			report("  per decoded byte", int64(len(bodies[fmt.Sprint("plain", n)])), c)
		}
	}
	for range b.N {
		// The figures are logged above; there is nothing to repeat.
	}
}

// BenchmarkProxyAdmission is the work admission adds to each proxied
// request, alone: the per-client count, and the fixed share reserved from
// a pool and the in-flight budget and given back.
//
//	go test ./pds -run '^$' -bench BenchmarkProxyAdmission
func BenchmarkProxyAdmission(b *testing.B) {
	s := &Server{cfg: config.DefaultConfig()}
	s.proxyAdmit = newProxyAdmission(16, 512, budget.New(budget.Config{Capacity: 256 << 20}))
	ctx := context.Background()
	target := proxy.Target{Configured: true}
	caller := proxy.Caller{DID: "did:plc:bench", Authenticated: true}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			leave, err := s.proxyAdmit.enter("did " + caller.DID.String())
			if err != nil {
				b.Fatal(err)
			}
			flow, err := s.startProxyFlow(ctx, s.proxyAdmit.budgets(target, caller))
			if err != nil {
				b.Fatal(err)
			}
			flow.release()
			leave()
		}
	})
}
