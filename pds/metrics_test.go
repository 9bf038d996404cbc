package pds

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// scrape reads the metrics as Prometheus does, from the private listener's
// handler, and returns every sample by its series (name{labels}).
func scrape(t *testing.T) map[string]float64 {
	t.Helper()
	ts := httptest.NewServer(metrics.PrivateMux())
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, "line %q", line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, "line %q", line)
		out[line[:i]] = v
	}
	require.NoError(t, sc.Err())
	return out
}

// TestMetricsMove drives a server through successes, 429s and 503s and
// checks that a scrape sees each, exactly as often as it happened:
// requests by method and status, the limiter's refusals, the budget's
// rejections, commits. The counters are process-wide, so the test is not
// parallel: Go runs it while every parallel test of the package is still
// waiting to start, and nothing but its own requests can move them.
func TestMetricsMove(t *testing.T) {
	ctx := context.Background()
	const capacity = 1 << 20
	b := budget.New(budget.Config{Capacity: capacity, MaxQueue: -1})
	set, err := ratelimit.NewSet(map[string][]ratelimit.Rule{
		ratelimit.PolicyGlobal:    {{Name: "5m", Limit: 1000, Window: 300e9}},
		ratelimit.PolicyRepoWrite: {{Name: "hour", Limit: 3, Window: 3600e9}},
	}, 0)
	require.NoError(t, err)
	e := newAccountEnv(t, envOptions{
		// Refused connections are not held: nothing here waits on them.
		configure: func(c *config.Config) { c.RefusalCoolOff = 0 },
		options: func(o *Options) {
			o.Budget = b
			o.Limits = set
		},
	})
	// Only this test registers a budget and limiters with the metrics.
	metrics.RegisterBudget(func() metrics.BudgetStats { return metrics.BudgetStats(b.Stats()) })
	metrics.RegisterLimiters(set.All()...)
	defer metrics.RegisterBudget(nil)
	defer metrics.RegisterLimiters()

	u := e.createUser(t)
	before := scrape(t)
	const (
		describe = `bulwark_http_requests_total{method="com.atproto.server.describeServer",status="200"}`
		created  = `bulwark_http_requests_total{method="com.atproto.repo.createRecord",status="200"}`
		limited  = `bulwark_http_requests_total{method="com.atproto.repo.createRecord",status="429"}`
		overload = `bulwark_http_requests_total{method="com.atproto.sync.getRepo",status="503"}`
		other    = `bulwark_http_requests_total{method="_other",status="404"}`
		refused  = `bulwark_ratelimit_refused_total{limiter="repoWrite",rule="hour"}`
		allowed  = `bulwark_ratelimit_allowed_total{limiter="global"}`
		rejected = `bulwark_budget_rejected_total`
		commits  = `bulwark_repo_commits_total`
		latency  = `bulwark_http_request_duration_seconds_count{method="com.atproto.server.describeServer"}`
	)

	for range 3 {
		e.get(t, "com.atproto.server.describeServer", "", nil).ok(t)
	}
	createPost := func() xrpcResult {
		return e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{
			"repo": u.did, "collection": "app.bsky.feed.post", "record": post("counted"),
		})
	}
	res := createPost().ok(t).json(t)
	// The commit counted is the one the engine made.
	head, err := e.engine.GetHead(ctx, u.did)
	require.NoError(t, err)
	require.Equal(t, head.Rev, res["commit"].(map[string]any)["rev"])
	createPost().fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
	hold, err := b.Acquire(ctx, capacity)
	require.NoError(t, err)
	e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {u.did.String()}}).fails(t, http.StatusServiceUnavailable, "ServiceOverloaded")
	hold.Release()
	resp, err := http.Get(e.url + "/no/such/page")
	require.NoError(t, err)
	resp.Body.Close()

	after := scrape(t)
	moved := func(series string, by float64) {
		t.Helper()
		require.Contains(t, after, series)
		require.Equal(t, by, after[series]-before[series], series)
	}
	moved(describe, 3)
	moved(latency, 3)
	moved(created, 1)
	moved(limited, 1)
	moved(overload, 1)
	moved(other, 1)
	moved(refused, 1)
	// The three describeServers, the two createRecords and the unknown
	// path; getRepo is under its own limit, unset here.
	moved(allowed, 6)
	moved(rejected, 1)
	moved(commits, 1)
	// Scrape-time state: the pool is not registered here, the budget is.
	require.Equal(t, float64(capacity), after["bulwark_budget_capacity_bytes"])
	require.Zero(t, after["bulwark_budget_in_use_bytes"])
}
