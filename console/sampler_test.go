package console_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/console"
)

// The sampler turns cumulative figures into per-minute ones: events from
// the head seq, commits, refusals by status, and the write p99 from the
// latency histogram's buckets; it keeps the last Keep samples.
func TestSampler(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	commits := prometheus.NewCounter(prometheus.CounterOpts{Name: "bulwark_repo_commits_total"})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bulwark_http_requests_total"}, []string{"method", "status"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bulwark_http_request_duration_seconds", Buckets: []float64{0.01, 0.1, 1}}, []string{"method"})
	reg.MustRegister(commits, requests, latency)
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var head int64 = 100
	s := console.NewSampler(console.SamplerConfig{
		Head:     func(context.Context) (int64, error) { return head, nil },
		Gatherer: reg, Keep: 3, Now: func() time.Time { return now },
	})
	ctx := context.Background()
	s.Sample(ctx)
	require.Empty(t, s.Samples(), "the first reading is the baseline")

	// One minute: 120 events, 30 commits, 4 × 429, 2 × 503, and 100
	// writes of which 98 under 10 ms and 2 between 0.1 s and 1 s.
	now, head = now.Add(time.Minute), head+120
	commits.Add(30)
	requests.WithLabelValues("com.atproto.repo.createRecord", "429").Add(4)
	requests.WithLabelValues("com.atproto.sync.getRepo", "503").Add(2)
	requests.WithLabelValues("com.atproto.repo.createRecord", "200").Add(100)
	for range 98 {
		latency.WithLabelValues("com.atproto.repo.createRecord").Observe(0.005)
	}
	for range 2 {
		latency.WithLabelValues("com.atproto.repo.applyWrites").Observe(0.5)
	}
	latency.WithLabelValues("com.atproto.sync.getRepo").Observe(30) // not a write
	s.Sample(ctx)
	got := s.Samples()
	require.Len(t, got, 1)
	require.Equal(t, 120.0, got[0].EventsPerMin)
	require.Equal(t, 30.0, got[0].CommitsPerMin)
	require.Equal(t, 4.0, got[0].Refused429)
	require.Equal(t, 2.0, got[0].Refused503)
	// Rank 99 of 100 falls in the (0.1, 1] bucket, half-way: 0.55 s.
	require.InDelta(t, 0.55, got[0].WriteP99, 1e-9)

	// A quiet minute: no writes, no p99.
	now = now.Add(time.Minute)
	s.Sample(ctx)
	require.True(t, math.IsNaN(s.Samples()[1].WriteP99))
	require.Zero(t, s.Samples()[1].EventsPerMin)

	// The ring keeps the last three, oldest first.
	for range 3 {
		now, head = now.Add(time.Minute), head+60
		s.Sample(ctx)
	}
	got = s.Samples()
	require.Len(t, got, 3)
	require.Equal(t, now, got[2].At)
	require.Equal(t, now.Add(-2*time.Minute), got[0].At)
	require.Equal(t, 60.0, got[2].EventsPerMin)
}
