package pds

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/firehose"
)

// countingTracer counts every statement the pool runs.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// requestTracer counts the statements the pool runs for requests (their
// context carries requestKey), not the ones the hub runs on its own.
type requestTracer struct{ n atomic.Int64 }

// requestKey marks the context of a request to the test server.
type requestKey struct{}

func (c *requestTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if ctx.Value(requestKey{}) != nil {
		c.n.Add(1)
	}
	return ctx
}

func (c *requestTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type firehoseBundle struct {
	url     string // http base URL
	wsURL   string
	queries *requestTracer
	hub     *firehose.Hub
}

// setupFirehose runs the real handler with a firehose hub on a fresh
// database whose pool counts statements.
func setupFirehose(t testing.TB, configure func(*config.Config), adm *firehose.AdmissionConfig) *firehoseBundle {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	if configure != nil {
		configure(cfg)
	}
	require.NoError(t, cfg.Finalize())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr := &requestTracer{}
	pcfg, err := pgxpool.ParseConfig(dbtest.NewURL(t))
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = tr
	ctx, cancel := context.WithCancel(context.Background())
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	// Poll rarely: the hub has nothing to do in these tests.
	hub := firehose.NewHub(pool, firehose.Config{PollInterval: time.Hour, Logger: logger})
	var wg sync.WaitGroup
	wg.Go(func() { _ = hub.Run(ctx) })
	s, err := New(Options{Config: cfg, DB: pool, Logger: logger, Version: "test", Firehose: hub, FirehoseAdmission: adm})
	require.NoError(t, err)
	h := s.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestKey{}, true)))
	}))
	t.Cleanup(func() {
		cancel()
		ts.CloseClientConnections()
		ts.Close()
		wg.Wait()
		pool.Close()
	})
	return &firehoseBundle{
		url:     ts.URL,
		wsURL:   "ws" + strings.TrimPrefix(ts.URL, "http") + "/xrpc/com.atproto.sync.subscribeRepos",
		queries: tr,
		hub:     hub,
	}
}

// TestSubscribeFloodRefusedWithoutQueries replays the incident's flood: one
// address redialling in a tight loop gets 429 with Retry-After and an XRPC
// body, and the database sees nothing from it.
func TestSubscribeFloodRefusedWithoutQueries(t *testing.T) {
	t.Parallel()
	b := setupFirehose(t, nil, nil)
	var conns []*websocket.Conn
	for range config.DefaultFirehoseBurst {
		c, resp, err := websocket.DefaultDialer.Dial(b.wsURL+"?cursor=0", nil)
		require.NoError(t, err)
		resp.Body.Close()
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// Once live, a subscription reads nothing until an event comes.
	require.Eventually(t, func() bool { return b.hub.Live() == len(conns) }, 10*time.Second, time.Millisecond)

	before := b.queries.n.Load()
	for i := range 500 {
		c, resp, err := websocket.DefaultDialer.Dial(b.wsURL+"?cursor=0", nil)
		require.Error(t, err)
		require.Nil(t, c)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		if i == 0 {
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Contains(t, string(body), `"error":"RateLimitExceeded"`)
			require.NotEmpty(t, resp.Header.Get("Retry-After"))
		}
		resp.Body.Close()
	}
	require.Equal(t, before, b.queries.n.Load(), "refused upgrades must not touch the database")
}

func TestSubscribeBadRequests(t *testing.T) {
	t.Parallel()
	b := setupFirehose(t, nil, &firehose.AdmissionConfig{Burst: 1000})
	resp, body := do(t, http.MethodGet, b.url+"/xrpc/com.atproto.sync.subscribeRepos", nil, nil)
	requireXRPCError(t, resp, body, http.StatusBadRequest, "InvalidRequest")
	for _, c := range []string{"-1", "abc", "1.5"} {
		_, resp, err := websocket.DefaultDialer.Dial(b.wsURL+"?cursor="+c, nil)
		require.Error(t, err)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "cursor %q", c)
		resp.Body.Close()
	}
}

// TestSubscribeForwardedClients: behind a trusted proxy each forwarded
// address has its own bucket; from anyone else the header is ignored.
func TestSubscribeForwardedClients(t *testing.T) {
	t.Parallel()
	b := setupFirehose(t, func(c *config.Config) {
		c.FirehoseBurst = 1
	}, nil)
	dial := func(xff string) int {
		h := http.Header{}
		if xff != "" {
			h.Set("X-Forwarded-For", xff)
		}
		c, resp, err := websocket.DefaultDialer.Dial(b.wsURL, h)
		if err == nil {
			c.Close()
			return http.StatusSwitchingProtocols
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Not a trusted proxy: the header is the client's own words.
	require.Equal(t, http.StatusSwitchingProtocols, dial("203.0.113.1"))
	require.Equal(t, http.StatusTooManyRequests, dial("203.0.113.2"))

	bp := setupFirehose(t, func(c *config.Config) {
		c.FirehoseBurst = 1
		c.TrustedProxies = append(c.TrustedProxies, netip.MustParsePrefix("127.0.0.0/8"))
	}, nil)
	b = bp
	require.Equal(t, http.StatusSwitchingProtocols, dial("203.0.113.1"))
	require.Equal(t, http.StatusTooManyRequests, dial("203.0.113.1"))
	require.Equal(t, http.StatusSwitchingProtocols, dial("203.0.113.2"))
}
