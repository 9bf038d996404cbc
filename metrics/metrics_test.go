package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// scrape fetches the exposition text and returns its samples by series,
// like `bulwark_http_requests_total{method="x",status="200"}`.
func scrape(t *testing.T) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	samples := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		samples[line[:i]] = v
	}
	require.NoError(t, sc.Err())
	return samples
}

func TestRequestMetricsMove(t *testing.T) {
	t.Parallel()
	const m = "com.example.test.requestMetricsMove"
	before := scrape(t)
	ObserveRequest(m, 200, 3*time.Millisecond)
	ObserveRequest(m, 200, 4*time.Millisecond)
	ObserveRequest(m, 429, 50*time.Microsecond)
	after := scrape(t)

	ok := fmt.Sprintf(`bulwark_http_requests_total{method=%q,status="200"}`, m)
	limited := fmt.Sprintf(`bulwark_http_requests_total{method=%q,status="429"}`, m)
	require.Equal(t, before[ok]+2, after[ok])
	require.Equal(t, before[limited]+1, after[limited])
	count := fmt.Sprintf(`bulwark_http_request_duration_seconds_count{method=%q}`, m)
	require.Equal(t, before[count]+3, after[count])
	fast := fmt.Sprintf(`bulwark_http_request_duration_seconds_bucket{method=%q,le="0.0005"}`, m)
	require.Equal(t, before[fast]+1, after[fast], "the refusal lands in the fastest bucket")

	ObserveRequest("", 404, time.Millisecond)
	require.Positive(t, scrape(t)[`bulwark_http_requests_total{method="_other",status="404"}`])
}

func TestMethodLabelsBounded(t *testing.T) {
	t.Parallel()
	s := &labelSet{max: 3}
	for i := range 10 {
		s.label(fmt.Sprint("com.example.m", i))
	}
	require.Equal(t, "com.example.m2", s.label("com.example.m2"))
	require.Equal(t, OtherMethod, s.label("com.example.m3"))
	require.Equal(t, OtherMethod, s.label(""))
	require.Len(t, s.seen, 3)
}

// TestCollectorsRegistered: every collector the package exports is in
// Registry, so whatever code records in it shows in a scrape. That the
// code records it is tested where the work happens: requests, commits and
// refusals in pds, the event log's seq in cmd/bulwark.
func TestCollectorsRegistered(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]prometheus.Collector{
		"Requests": Requests, "RequestDuration": RequestDuration, "RefusalCoolOffs": RefusalCoolOffs,
		"CARCacheHits": CARCacheHits, "CARCacheBuilds": CARCacheBuilds, "CARCacheBytes": CARCacheBytes,
		"BackgroundPauses": BackgroundPauses, "BackgroundPauseTimeouts": BackgroundPauseTimeouts,
		"BackgroundPauseSeconds": BackgroundPauseSeconds,
		"Commits":                Commits, "CommitGroups": CommitGroups, "GroupedCommits": GroupedCommits,
		"CommitGroupRetries": CommitGroupRetries, "StaleRoots": StaleRoots, "StateRefreshes": StateRefreshes,
		"CommitPlans": CommitPlans, "RootChecks": RootChecks, "RepoHints": RepoHints, "ClusterHintDatagrams": ClusterHintDatagrams,
		"EventLogLastSeq": EventLogLastSeq, "SequencerLag": SequencerLag, "SequencerPending": SequencerPending,
		"FirehoseSubscribers": FirehoseSubscribers, "FirehoseFrames": FirehoseFrames, "FirehoseBytes": FirehoseBytes,
		"FirehoseRefused": FirehoseRefused, "FirehoseDisconnects": FirehoseDisconnects,
	} {
		var already prometheus.AlreadyRegisteredError
		require.ErrorAs(t, Registry.Register(c), &already, name)
	}
}

// TestBudgetAndLimiterMetrics is not parallel: the budget and limiters
// reported are process-wide registrations.
func TestBudgetAndLimiterMetrics(t *testing.T) {
	ctx := context.Background()
	b := budget.New(budget.Config{Capacity: 10, MaxQueue: -1})
	RegisterBudget(func() BudgetStats { return BudgetStats(b.Stats()) })
	defer RegisterBudget(nil)
	l := ratelimit.MustNew(ratelimit.Config{Name: "testLimiter", Rules: []ratelimit.Rule{{Name: "5m", Limit: 1, Window: 5 * time.Minute}}})
	RegisterLimiters(l)
	defer RegisterLimiters()

	hold, err := b.Acquire(ctx, 10)
	require.NoError(t, err)
	for range 2 {
		_, err = b.Acquire(ctx, 1)
		require.ErrorIs(t, err, budget.ErrOverloaded)
	}
	l.Allow("a")
	l.Allow("a")
	l.Allow("a")
	l.Allow("b")

	s := scrape(t)
	require.Equal(t, float64(10), s["bulwark_budget_capacity_bytes"])
	require.Equal(t, float64(10), s["bulwark_budget_in_use_bytes"])
	require.Equal(t, float64(2), s["bulwark_budget_rejected_total"])
	require.Equal(t, float64(1), s["bulwark_budget_admitted_total"])
	require.Equal(t, float64(2), s[`bulwark_ratelimit_allowed_total{limiter="testLimiter"}`])
	require.Equal(t, float64(2), s[`bulwark_ratelimit_refused_total{limiter="testLimiter",rule="5m"}`])
	require.Equal(t, float64(2), s[`bulwark_ratelimit_keys{limiter="testLimiter"}`])

	hold.Release()
	require.Zero(t, scrape(t)["bulwark_budget_in_use_bytes"])
}

// TestPoolMetrics is not parallel (process-wide registration). pgxpool
// connects lazily, so a pool for an address nobody listens on reports its
// configuration without a database.
func TestPoolMetrics(t *testing.T) {
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?pool_max_conns=7")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	RegisterPool(pool)
	defer RegisterPool(nil)

	s := scrape(t)
	require.Equal(t, float64(7), s["bulwark_pg_pool_max_conns"])
	require.Contains(t, s, "bulwark_pg_pool_acquires_total")
	require.Contains(t, s, "bulwark_pg_pool_empty_acquires_total")
}

// TestRuntimeMetricsExported: the Go collector exports the scheduler's
// latency histogram (not among its defaults) beside its defaults, and the
// process collector this process's memory.
func TestRuntimeMetricsExported(t *testing.T) {
	samples := scrape(t)
	require.Contains(t, samples, "go_sched_latencies_seconds_count")
	require.Contains(t, samples, "go_memstats_heap_inuse_bytes", "the default Go metrics stay")
	// The process collector reads this process's memory from /proc: what
	// the load tool's RSS figures are checked against.
	require.Positive(t, samples["bulwark_process_resident_memory_bytes"])
}

func TestServe(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, slog.New(slog.DiscardHandler)) }()

	base := "http://" + ln.Addr().String()
	for path, want := range map[string]string{
		"/metrics":      "bulwark_repo_commits_total",
		"/debug/pprof/": "goroutine",
	} {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, string(body), want, path)
	}
	cancel()
	require.NoError(t, <-done)
}

func TestServeBindError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	err = Serve(context.Background(), ln.Addr().String(), slog.New(slog.DiscardHandler))
	require.Error(t, err)
}

// BenchmarkObserveRequest is what every request pays for its metrics.
func BenchmarkObserveRequest(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		ObserveRequest("com.example.bench.observe", 200, time.Millisecond)
	}
}
