package pds

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// refusedFloodServer is a server with a firehose hub that tracks consumer
// health, admitting one subscription an hour per client, with the default
// rate limits, and holding no refused connection (so a test can send
// thousands of refused requests quickly).
func refusedFloodServer(t *testing.T) (url string, health *firehose.Health) {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.RefusalCoolOff = 0
	require.NoError(t, cfg.Finalize())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	pool := dbtest.New(t)
	health = firehose.NewHealth(firehose.HealthConfig{Logger: logger})
	hub := firehose.NewHub(pool, firehose.Config{PollInterval: time.Hour, Logger: logger, Health: health})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = hub.Run(ctx) })
	limits, err := ratelimit.NewSet(ratelimit.DefaultPolicies(), 0)
	require.NoError(t, err)
	s, err := New(Options{
		Config: cfg, DB: pool, Logger: logger, Version: "test", Firehose: hub, Limits: limits,
		FirehoseAdmission: &firehose.AdmissionConfig{Rate: rate.Every(time.Hour), Burst: 1},
	})
	require.NoError(t, err)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		cancel()
		ts.CloseClientConnections()
		ts.Close()
		wg.Wait()
	})
	return ts.URL, health
}

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestRefusedSubscribeFloodBoundedMemory: one address sending 20,000
// subscribeRepos requests that are refused, each with a 60 KB User-Agent,
// leaves the server's live heap a few MiB larger at most: a refusal is
// counted per address, and no User-Agent is kept whole.
//
// Not parallel: it measures the process's heap, so other tests must not
// run beside it (parallel tests wait until the sequential ones are done).
func TestRefusedSubscribeFloodBoundedMemory(t *testing.T) {
	const (
		requests = 20_000
		workers  = 8
		uaBytes  = 60_000
	)
	url, health := refusedFloodServer(t)
	url += "/xrpc/com.atproto.sync.subscribeRepos"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	send := func(i int) (int, error) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		// A different agent each time, as a flood that rotates them
		// would send.
		req.Header.Set("User-Agent", fmt.Sprintf("%08d%s", i, strings.Repeat("a", uaBytes)))
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}

	// Warm up: the admitted request, the connections, the tables.
	for i := range 2 * workers {
		_, err := send(i)
		require.NoError(t, err)
	}
	before := heapInUse()

	statuses := make([]map[int]int, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		statuses[w] = map[int]int{}
		wg.Go(func() {
			for i := w; i < requests; i += workers {
				code, err := send(i)
				if err != nil {
					errs[w] = err
					return
				}
				statuses[w][code]++
			}
		})
	}
	wg.Wait()
	total := 0
	for w := range workers {
		require.NoError(t, errs[w])
		require.Equal(t, statuses[w][http.StatusTooManyRequests], requests/workers, "every request is refused: %v", statuses[w])
		total += statuses[w][http.StatusTooManyRequests]
	}
	require.Equal(t, requests, total)

	after := heapInUse()
	growth := int64(after) - int64(before)
	t.Logf("live heap %d → %d bytes (%+d)", before, after, growth)
	require.Less(t, growth, int64(4<<20), "the live heap grew by %d bytes", growth)

	consumers := health.Consumers()
	require.Len(t, consumers, 1, "refusals are counted per address")
	require.Empty(t, consumers[0].UserAgent)
	// Refusals within the per-address subscribeRefused limit (600 per 5
	// minutes, refilling while the test runs) are counted; the rest cost
	// nothing to record.
	limit := int64(ratelimit.DefaultPolicies()[ratelimit.PolicySubscribeRefused][0].Limit)
	require.GreaterOrEqual(t, consumers[0].Refused, limit)
	require.Less(t, consumers[0].Refused, int64(requests/2))
}

// A flood of refused subscribeRepos upgrades from an address does not
// lock that address out of the rest of the API: refusals have their own
// per-address budget, not the global one.
func TestSubscribeRefusalsSpareTheAPI(t *testing.T) {
	t.Parallel()
	url, _ := refusedFloodServer(t)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	get := func(nsid string) int {
		resp, err := client.Get(url + "/xrpc/" + nsid)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// More refusals than the whole global budget.
	global := ratelimit.DefaultPolicies()[ratelimit.PolicyGlobal][0].Limit
	for range global + 100 {
		get("com.atproto.sync.subscribeRepos")
	}
	require.Equal(t, http.StatusOK, get("com.atproto.server.describeServer"))
}
