package proxy

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// benchFront is a proxy front with a keep-alive client, for benchmarks.
func benchFront(b *testing.B, cfg Config, c Caller) (*httptest.Server, *http.Client) {
	b.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nsid := syntax.NSID(strings.TrimPrefix(r.URL.Path, "/xrpc/"))
		if err := p.Serve(w, r, nsid, c); err != nil {
			writeXRPCError(w, err)
		}
	}))
	b.Cleanup(srv.Close)
	return srv, benchClient()
}

func benchClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 128
	t.DisableCompression = true
	return &http.Client{Transport: t}
}

func fetch(c *http.Client, url string) (int64, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %d", resp.StatusCode)
	}
	return n, err
}

// BenchmarkGET compares one small JSON GET made directly to a local fake
// app view with the same GET through the proxy, without and with a
// service token, and reports latency percentiles.
func BenchmarkGET(b *testing.B) {
	body := `{"feed":[` + strings.Repeat(`{"post":{"uri":"at://did:plc:x/app.bsky.feed.post/1","cid":"bafy"}},`, 30) + `{}]}`
	up := httptest.NewServer(jsonOK(body))
	b.Cleanup(up.Close)
	k, _ := account(&testing.T{}, callerDID)
	cfg := Config{AppViewURL: up.URL, AppViewDID: appViewDID, Keys: k}
	plain, plainClient := benchFront(b, cfg, Caller{})
	authd, authClient := benchFront(b, cfg, authed)
	cases := []struct {
		name string
		url  string
		c    *http.Client
	}{
		{"direct", up.URL, benchClient()},
		{"proxied", plain.URL, plainClient},
		{"proxied+token", authd.URL, authClient},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			u := tc.url + "/xrpc/app.bsky.feed.getTimeline?limit=30"
			lat := make([]time.Duration, 0, 1024)
			for b.Loop() {
				start := time.Now()
				if _, err := fetch(tc.c, u); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

var zeros = make([]byte, 64<<10)

// BenchmarkStreams64x10MB relays 64 concurrent 10 MB responses and
// reports the peak heap in use above the idle baseline (sampled), directly
// and through the proxy.
func BenchmarkStreams64x10MB(b *testing.B) {
	const streams, size = 64, 10 << 20
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for n := size; n > 0; n -= len(zeros) {
			if _, err := w.Write(zeros[:min(n, len(zeros))]); err != nil {
				return
			}
		}
	}))
	b.Cleanup(up.Close)
	front, _ := benchFront(b, Config{AppViewURL: up.URL, AppViewDID: appViewDID}, Caller{})
	for _, tc := range []struct{ name, url string }{{"direct", up.URL}, {"proxied", front.URL}} {
		b.Run(tc.name, func(b *testing.B) {
			c := benchClient()
			u := tc.url + "/xrpc/com.example.blob"
			b.SetBytes(streams * size)
			runtime.GC()
			base := heapInuse()
			var peak atomic.Uint64
			stop := sampleHeap(&peak)
			for b.Loop() {
				if err := parallelFetch(c, u, streams, size); err != nil {
					b.Fatal(err)
				}
			}
			stop()
			b.ReportMetric(float64(peak.Load()-min(base, peak.Load()))/(1<<20), "peak-heap-MB")
		})
	}
}

func heapInuse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// sampleHeap records the largest HeapInuse seen until stop is called.
func sampleHeap(peak *atomic.Uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapInuse(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func parallelFetch(c *http.Client, u string, streams int, size int64) error {
	errs := make(chan error, streams)
	for range streams {
		go func() {
			n, err := fetch(c, u)
			if err == nil && n != size {
				err = fmt.Errorf("got %d bytes, want %d", n, size)
			}
			errs <- err
		}()
	}
	var all []error
	for range streams {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
