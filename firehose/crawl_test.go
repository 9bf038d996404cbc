package firehose_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/firehose"
)

// crawlCall is one requestCrawl a relay received.
type crawlCall struct {
	method, path, hostname string
	err                    error
}

// crawlRelay is a relay that reports each requestCrawl on calls.
func crawlRelay(t *testing.T) (*httptest.Server, chan crawlCall) {
	t.Helper()
	calls := make(chan crawlCall, 100)
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Hostname string }
		err := json.NewDecoder(r.Body).Decode(&body)
		calls <- crawlCall{method: r.Method, path: r.URL.Path, hostname: body.Hostname, err: err}
	}))
	t.Cleanup(relay.Close)
	return relay, calls
}

// testClock hands the notifier the time the test chooses, one reading per
// round of calls: a round starts only when the test sends it its time, so
// the test knows exactly which round it is in.
type testClock struct {
	ctx context.Context
	now chan time.Time
}

func (c *testClock) Now() time.Time {
	select {
	case t := <-c.now:
		return t
	case <-c.ctx.Done():
		return time.Time{}
	}
}

// startNotifier runs a notifier of relays driven by a test clock until the
// test ends.
func startNotifier(t *testing.T, interval time.Duration, relays ...string) (*firehose.CrawlNotifier, *testClock) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	clock := &testClock{ctx: ctx, now: make(chan time.Time)}
	n := firehose.NewCrawlNotifier(firehose.CrawlConfig{
		Hostname: "pds.example.com", Crawlers: relays, Interval: interval, Logger: quietLogger, Now: clock.Now,
	})
	done := make(chan struct{})
	go func() { _ = n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return n, clock
}

func nextCall(t *testing.T, calls chan crawlCall) crawlCall {
	t.Helper()
	select {
	case c := <-calls:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the relay was not called")
		return crawlCall{}
	}
}

func TestCrawlNotifierDebounces(t *testing.T) {
	t.Parallel()
	relay, calls := crawlRelay(t)
	// A relay that is down must not hold up the other.
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	n, clock := startNotifier(t, time.Hour, down.URL, relay.URL+"/")
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

	for range 100 {
		n.Notify(1) // never blocks
	}
	clock.now <- t0
	c := nextCall(t, calls)
	require.NoError(t, c.err)
	require.Equal(t, http.MethodPost, c.method)
	require.Equal(t, "/xrpc/com.atproto.sync.requestCrawl", c.path)
	require.Equal(t, "pds.example.com", c.hostname)

	// More writes inside the interval: a round runs and calls nobody. The
	// round after it starts only once it is over, so when the notifier
	// reads the clock for that one, the first has made every call it would.
	for range 100 {
		n.Notify(2)
	}
	clock.now <- t0.Add(time.Minute)
	n.Notify(3)
	clock.now <- t0.Add(2 * time.Minute)
	require.Empty(t, calls, "at most once per interval per relay")
}

func TestCrawlNotifierAfterInterval(t *testing.T) {
	t.Parallel()
	relay, calls := crawlRelay(t)
	n, clock := startNotifier(t, time.Minute, relay.URL)
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		n.Notify(0)
		clock.now <- t0.Add(time.Duration(i) * time.Minute)
		require.NoError(t, nextCall(t, calls).err, "call %d", i+1)
	}
}
