package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// TestServeProtection runs serve with a metrics listener and a tight global
// limit: the limit answers 429 on the public listener, the private one
// serves /metrics (with the limiter, the budget, the export slots and the
// pool) and pprof, and the public one serves neither.
//
// Not parallel: the metrics registry is process-wide, and another serve
// started by a parallel test would replace the limiters and budget it
// reports.
func TestServeProtection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	metricsAddr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := []string{"serve", "--database-url", dbtest.NewURL(t), "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--metrics-listen", metricsAddr, "--ratelimits", "global=3/5m", "--inflight-budget", "32MiB"}
	addr, done, logs := startServe(t, ctx, args)

	get := func(u string) (int, http.Header, string) {
		resp, err := http.Get(u)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(b)
	}
	for range 3 {
		code, h, _ := get("http://" + addr + "/xrpc/com.atproto.server.describeServer")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "3", h.Get("RateLimit-Limit"))
	}
	code, h, body := get("http://" + addr + "/xrpc/com.atproto.server.describeServer")
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Contains(t, body, "RateLimitExceeded")
	require.NotEmpty(t, h.Get("Retry-After"))
	code, _, _ = get("http://" + addr + "/xrpc/_health")
	require.Equal(t, http.StatusOK, code, "health is not rate limited")

	code, _, metrics := get("http://" + metricsAddr + "/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`bulwark_ratelimit_refused_total{limiter="global",rule="5m"} 1`,
		`bulwark_budget_capacity_bytes 3.3554432e+07`,
		`bulwark_export_slots_capacity `,
		`bulwark_password_slots_queue_max 64`,
		`bulwark_pg_pool_max_conns `,
		`bulwark_http_requests_total{method="com.atproto.server.describeServer",status="429"} `,
		`bulwark_eventlog_last_seq `,
	} {
		require.Contains(t, metrics, want)
	}
	code, _, _ = get("http://" + metricsAddr + "/debug/pprof/cmdline")
	require.Equal(t, http.StatusOK, code)
	for _, private := range []string{"/metrics", "/debug/pprof/cmdline"} {
		// From another address: this one has spent its global limit,
		// which unknown paths are under too.
		resp, err := newSourceClient().Get("http://" + addr + private)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		code, body := resp.StatusCode, string(b)
		require.Equal(t, http.StatusNotFound, code, "%s on the public listener: %.100s", private, body)
		require.False(t, strings.Contains(body, "bulwark_"), "no metrics on the public listener")
	}

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
}
