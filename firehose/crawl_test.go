package firehose_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/firehose"
)

func TestCrawlNotifierDebounces(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var mu sync.Mutex
	var hosts []string
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, http.MethodPost, r.Method)
		require.Equal(t, "/xrpc/com.atproto.sync.requestCrawl", r.URL.Path)
		var body struct{ Hostname string }
		require.NoError(t, json.NewDecoder(r.Body).Decode(&body))
		mu.Lock()
		hosts = append(hosts, body.Hostname)
		mu.Unlock()
		calls.Add(1)
	}))
	defer relay.Close()
	// A relay that is down must not hold up the other.
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer down.Close()

	n := firehose.NewCrawlNotifier(firehose.CrawlConfig{
		Hostname: "pds.example.com",
		Crawlers: []string{down.URL, relay.URL + "/"},
		Logger:   quietLogger,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.Run(ctx); close(done) }()
	for range 100 {
		n.Notify(1) // never blocks
	}
	require.Eventually(t, func() bool { return calls.Load() == 1 }, 10*time.Second, time.Millisecond)
	for range 100 {
		n.Notify(2)
	}
	// Give the notifier every chance to (wrongly) call again.
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, int64(1), calls.Load(), "at most once per interval per relay")
	cancel()
	<-done
	mu.Lock()
	require.Equal(t, []string{"pds.example.com"}, hosts)
	mu.Unlock()
}

func TestCrawlNotifierAfterInterval(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer relay.Close()
	n := firehose.NewCrawlNotifier(firehose.CrawlConfig{Hostname: "h", Crawlers: []string{relay.URL}, Interval: time.Millisecond, Logger: quietLogger})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = n.Run(ctx) }()
	require.Eventually(t, func() bool {
		n.Notify(0)
		return calls.Load() >= 3
	}, 10*time.Second, 5*time.Millisecond)
}
