package alert_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/alert"
)

// receiver is a webhook endpoint answering from a script of statuses (200
// once the script runs out) and passing on every body it is sent.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	script []int
	bodies chan map[string]any
}

func newReceiver(t *testing.T, script ...int) *receiver {
	r := &receiver{script: script, bodies: make(chan map[string]any, 16)}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body map[string]any
		if req.Header.Get("Content-Type") != "application/json" || json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&body) != nil {
			http.Error(w, "want JSON", http.StatusUnsupportedMediaType)
			return
		}
		r.bodies <- body
		r.mu.Lock()
		status := http.StatusOK
		if len(r.script) > 0 {
			status, r.script = r.script[0], r.script[1:]
		}
		r.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(r.Close)
	return r
}

// waits records the backoff waits asked for and lets each pass at once.
type waits struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waits) After(d time.Duration) <-chan time.Time {
	w.mu.Lock()
	w.d = append(w.d, d)
	w.mu.Unlock()
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

func (w *waits) all() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Duration(nil), w.d...)
}

type fixture struct {
	hook  *alert.Webhook
	now   time.Time
	waits *waits
	logs  *bytes.Buffer
	reg   *prometheus.Registry
}

func newHook(t *testing.T, url string, cfg alert.Config) *fixture {
	t.Helper()
	f := &fixture{now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC), waits: &waits{}, logs: &bytes.Buffer{}, reg: prometheus.NewRegistry()}
	cfg.URL, cfg.Host = url, "pds.example.com"
	cfg.Now = func() time.Time { return f.now }
	cfg.After, cfg.Registerer = f.waits.After, f.reg
	cfg.Logger = slog.New(slog.NewTextHandler(f.logs, nil))
	h, err := alert.New(cfg)
	require.NoError(t, err)
	f.hook = h
	return f
}

var stuck = alert.Alert{
	Kind: alert.KindRelayStuck, Subject: "bsky.network", Severity: alert.SeverityCritical,
	Summary: "relay bsky.network is stuck at seq 41",
	Details: map[string]any{"relaySeq": 41, "command": "bulwark admin firehose rewrite-as-sync --seq 42"},
}

// The receiver gets the alert as JSON with kind, severity, summary,
// details, time and host.
func TestWebhookPostsJSON(t *testing.T) {
	r := newReceiver(t)
	f := newHook(t, r.URL, alert.Config{})
	require.True(t, f.hook.Send(stuck))
	require.Equal(t, 1, f.hook.Deliver(context.Background()))
	got := <-r.bodies
	require.Equal(t, map[string]any{
		"kind": "relay_stuck", "subject": "bsky.network", "severity": "critical",
		"summary": "relay bsky.network is stuck at seq 41",
		"details": map[string]any{"relaySeq": 41.0, "command": "bulwark admin firehose rewrite-as-sync --seq 42"},
		"time":    "2026-03-04T05:06:07Z", "host": "pds.example.com",
	}, got)
	require.Equal(t, alert.Stats{Sent: 1}, f.hook.Stats())
	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP bulwark_alerts_total Alerts by outcome: sent, failed (attempts exhausted), dropped (queue full), deduplicated.
# TYPE bulwark_alerts_total counter
bulwark_alerts_total{result="sent"} 1
`), "bulwark_alerts_total"))
}

// A failing receiver is retried with doubling backoff until it takes the
// alert; one that keeps failing is given up after MaxAttempts, and the
// log names neither the URL nor its token.
func TestWebhookRetries(t *testing.T) {
	r := newReceiver(t, 500, 503)
	f := newHook(t, r.URL, alert.Config{Backoff: time.Second})
	require.True(t, f.hook.Send(stuck))
	require.Equal(t, 1, f.hook.Deliver(context.Background()))
	require.Len(t, r.bodies, 3)
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second}, f.waits.all())
	require.Equal(t, int64(1), f.hook.Stats().Sent)

	down := newReceiver(t, 500, 500, 500, 500)
	f = newHook(t, down.URL+"/hooks/secret-token", alert.Config{MaxAttempts: 3, Backoff: time.Second, MaxBackoff: 90 * time.Second})
	require.True(t, f.hook.Send(stuck))
	require.Zero(t, f.hook.Deliver(context.Background()))
	require.Len(t, down.bodies, 3)
	require.Equal(t, alert.Stats{Failed: 1}, f.hook.Stats())
	require.Contains(t, f.logs.String(), "answered 500")
	require.NotContains(t, f.logs.String(), "secret-token")

	// A receiver that is gone: network errors are retried, the URL is not logged.
	gone := newReceiver(t)
	gone.Close()
	f = newHook(t, gone.URL+"/hooks/secret-token", alert.Config{MaxAttempts: 2})
	require.True(t, f.hook.Send(stuck))
	require.Zero(t, f.hook.Deliver(context.Background()))
	require.Len(t, f.waits.all(), 1)
	require.NotContains(t, f.logs.String(), "secret-token")

	// A 4xx other than 408/429 is not retried.
	bad := newReceiver(t, 400)
	f = newHook(t, bad.URL, alert.Config{})
	require.True(t, f.hook.Send(stuck))
	require.Zero(t, f.hook.Deliver(context.Background()))
	require.Len(t, bad.bodies, 1)
	require.Empty(t, f.waits.all())
}

// An alert of the same kind and subject within the window is dropped.
func TestWebhookDeduplicates(t *testing.T) {
	r := newReceiver(t)
	f := newHook(t, r.URL, alert.Config{DedupWindow: 10 * time.Minute})
	require.True(t, f.hook.Send(stuck))
	f.now = f.now.Add(9 * time.Minute)
	require.False(t, f.hook.Send(stuck))
	other := stuck
	other.Subject = "relay.example.org"
	require.True(t, f.hook.Send(other))
	consumer := stuck
	consumer.Kind = alert.KindConsumerStuck
	require.True(t, f.hook.Send(consumer))
	f.now = f.now.Add(time.Minute)
	require.True(t, f.hook.Send(stuck))
	require.Equal(t, 4, f.hook.Deliver(context.Background()))
	require.Equal(t, int64(1), f.hook.Stats().Deduplicated)
}

// Alerts naming an incident are deduplicated by it, whatever their kind
// or subject: a relay stuck on an event, seen by the relay watch and by
// consumer health, is one alert. Another incident of the same relay (a
// false alarm at another seq before the real one) is not held back.
func TestWebhookDeduplicatesIncidents(t *testing.T) {
	r := newReceiver(t)
	f := newHook(t, r.URL, alert.Config{DedupWindow: 10 * time.Minute})
	consumer := alert.Alert{Kind: alert.KindConsumerStuck, Subject: "192.0.2.9 indigo-relay", Incident: alert.StuckIncident(42), Summary: "consumer stuck at 42"}
	require.True(t, f.hook.Send(consumer))
	relay := stuck
	relay.Incident = alert.StuckIncident(42)
	require.False(t, f.hook.Send(relay), "the relay watch's alert of the same incident")
	f.now = f.now.Add(time.Minute)
	relay.Incident = alert.StuckIncident(77)
	require.True(t, f.hook.Send(relay), "the same relay, another incident")
	require.False(t, f.hook.Send(relay))
	require.Equal(t, 2, f.hook.Deliver(context.Background()))
	require.Equal(t, int64(2), f.hook.Stats().Deduplicated)
	require.Equal(t, "firehose-stuck:seq:42", (<-r.bodies)["incident"])
}

// The queue is bounded: Send never waits, and what does not fit is
// dropped and counted.
func TestWebhookQueueBound(t *testing.T) {
	r := newReceiver(t)
	f := newHook(t, r.URL, alert.Config{QueueSize: 2})
	for i, subject := range []string{"a", "b", "c", "d"} {
		a := stuck
		a.Subject = subject
		require.Equal(t, i < 2, f.hook.Send(a), subject)
	}
	require.Equal(t, alert.Stats{Dropped: 2, Queued: 2}, f.hook.Stats())
	require.Equal(t, 1, strings.Count(f.logs.String(), "alert queue is full"), "one warning per overflow")
	require.Equal(t, 1, testutil.CollectAndCount(f.reg, "bulwark_alerts_total"))
	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP bulwark_alerts_total Alerts by outcome: sent, failed (attempts exhausted), dropped (queue full), deduplicated.
# TYPE bulwark_alerts_total counter
bulwark_alerts_total{result="dropped"} 2
`), "bulwark_alerts_total"))

	// Run delivers them; then the queue takes alerts again.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.hook.Run(ctx) }()
	require.Equal(t, "a", (<-r.bodies)["subject"])
	require.Equal(t, "b", (<-r.bodies)["subject"])
	e := stuck
	e.Subject = "e"
	require.True(t, f.hook.Send(e))
	require.Equal(t, "e", (<-r.bodies)["subject"])
	cancel()
	require.NoError(t, <-done)
}

// Bounds and defaults: a disabled hook drops everything; a bad URL is
// refused without echoing it; oversized fields are cut.
func TestWebhookEdges(t *testing.T) {
	var zero *alert.Webhook
	require.False(t, zero.Send(stuck))
	off, err := alert.New(alert.Config{})
	require.NoError(t, err)
	require.False(t, off.Enabled())
	require.False(t, off.Send(stuck))

	for _, u := range []string{"ftp://x/y", "not a url", "/relative", "https://"} {
		_, err := alert.New(alert.Config{URL: u})
		require.ErrorIs(t, err, alert.ErrInvalidURL, u)
		require.NotContains(t, err.Error(), u)
	}

	r := newReceiver(t)
	f := newHook(t, r.URL, alert.Config{})
	require.False(t, f.hook.Send(alert.Alert{Summary: "no kind"}))
	big := alert.Alert{Kind: "overload_storm", Summary: strings.Repeat("é", 5000), Details: map[string]string{"x": strings.Repeat("y", 40<<10)}}
	require.True(t, f.hook.Send(big))
	f.hook.Deliver(context.Background())
	got := <-r.bodies
	require.LessOrEqual(t, len(got["summary"].(string)), 2000)
	require.Equal(t, map[string]any{"truncated": true, "bytes": float64(40<<10 + 8)}, got["details"])
	require.Equal(t, "warning", got["severity"])

	bad := alert.Alert{Kind: "overload_storm", Subject: "chan", Details: map[string]any{"c": make(chan int)}}
	require.True(t, f.hook.Send(bad))
	f.hook.Deliver(context.Background())
	require.Contains(t, (<-r.bodies)["details"], "error")
}

// Run stops when its context ends, also while waiting to retry.
func TestWebhookRunStops(t *testing.T) {
	r := newReceiver(t, 500)
	block := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	h, err := alert.New(alert.Config{URL: r.URL, After: func(time.Duration) <-chan time.Time {
		cancel()
		return block
	}})
	require.NoError(t, err)
	require.True(t, h.Send(stuck))
	require.NoError(t, h.Run(ctx))
	require.Len(t, r.bodies, 1)
	require.Equal(t, alert.Stats{}, h.Stats(), "neither sent nor failed: stopped")
}
