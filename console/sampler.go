package console

import (
	"context"
	"log/slog"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Defaults of SamplerConfig.
const (
	DefaultSampleInterval = time.Minute
	DefaultSampleKeep     = 24 * 60
)

// WriteMethods are the XRPC methods whose latency the overview's write
// p99 follows.
var WriteMethods = []string{
	"com.atproto.repo.createRecord", "com.atproto.repo.putRecord",
	"com.atproto.repo.deleteRecord", "com.atproto.repo.applyWrites",
}

// Metric names the sampler reads.
const (
	metricCommits  = "bulwark_repo_commits_total"
	metricRequests = "bulwark_http_requests_total"
	metricLatency  = "bulwark_http_request_duration_seconds"
)

// SamplerConfig tunes a Sampler. Head and Gatherer are its sources; a nil
// one leaves its figures at zero.
type SamplerConfig struct {
	// Head reads the newest seq (events per minute are its moves).
	Head func(ctx context.Context) (int64, error)
	// Gatherer is the metrics registry (commits, requests by status, write
	// latency), read once per sample.
	Gatherer prometheus.Gatherer
	// Interval is the time between samples (default 1 min).
	Interval time.Duration
	// Keep is how many samples are kept (default a day's worth, 1440).
	Keep   int
	Logger *slog.Logger
	Now    func() time.Time
}

// Sample is one interval's figures.
type Sample struct {
	At   time.Time
	Head int64
	// EventsPerMin and CommitsPerMin are rates over the interval.
	EventsPerMin  float64
	CommitsPerMin float64
	// WriteP99 is the 99th percentile of write latency over the interval,
	// in seconds (NaN: no writes).
	WriteP99 float64
	// Refused429 and Refused503 count refusals in the interval.
	Refused429 float64
	Refused503 float64
}

// Sampler keeps a ring of per-minute figures for the overview's
// sparklines: in memory, a day at most, nothing stored.
type Sampler struct {
	cfg SamplerConfig
	log *slog.Logger

	mu   sync.Mutex
	ring []Sample
	next int
	full bool
	prev *totals
}

// totals are the cumulative figures one sample is the difference of.
type totals struct {
	at       time.Time
	head     int64
	hasHead  bool
	commits  float64
	by429    float64
	by503    float64
	writeHis map[float64]float64 // upper bound -> cumulative count
}

// NewSampler returns a sampler for cfg.
func NewSampler(cfg SamplerConfig) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultSampleInterval
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultSampleKeep
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Sampler{cfg: cfg, log: cfg.Logger.With("component", "console-sampler"), ring: make([]Sample, cfg.Keep)}
}

// Run samples every Interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	s.Sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Sample(ctx)
		}
	}
}

// Sample reads the sources now and records the figures since the previous
// reading (the first reading records nothing).
func (s *Sampler) Sample(ctx context.Context) {
	cur := s.read(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.prev
	s.prev = cur
	if prev == nil {
		return
	}
	mins := cur.at.Sub(prev.at).Minutes()
	if mins <= 0 {
		return
	}
	sm := Sample{
		At: cur.at, Head: cur.head,
		CommitsPerMin: max(cur.commits-prev.commits, 0) / mins,
		Refused429:    max(cur.by429-prev.by429, 0),
		Refused503:    max(cur.by503-prev.by503, 0),
		WriteP99:      quantile(0.99, prev.writeHis, cur.writeHis),
	}
	if cur.hasHead && prev.hasHead {
		sm.EventsPerMin = float64(max(cur.head-prev.head, 0)) / mins
	}
	s.ring[s.next] = sm
	s.next = (s.next + 1) % len(s.ring)
	s.full = s.full || s.next == 0
}

// Samples returns the kept samples, oldest first.
func (s *Sampler) Samples() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full {
		return append([]Sample(nil), s.ring[:s.next]...)
	}
	return append(append([]Sample(nil), s.ring[s.next:]...), s.ring[:s.next]...)
}

// read takes the cumulative figures now.
func (s *Sampler) read(ctx context.Context) *totals {
	t := &totals{at: s.cfg.Now(), writeHis: map[float64]float64{}}
	if s.cfg.Head != nil {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		head, err := s.cfg.Head(ctx)
		cancel()
		if err == nil {
			t.head, t.hasHead = head, true
		}
	}
	if s.cfg.Gatherer == nil {
		return t
	}
	mfs, err := s.cfg.Gatherer.Gather()
	if err != nil && len(mfs) == 0 {
		s.log.Debug("gathering metrics for the console failed", "err", err)
		return t
	}
	writes := map[string]bool{}
	for _, m := range WriteMethods {
		writes[m] = true
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricCommits:
			for _, m := range mf.GetMetric() {
				t.commits += m.GetCounter().GetValue()
			}
		case metricRequests:
			for _, m := range mf.GetMetric() {
				switch label(m, "status") {
				case "429":
					t.by429 += m.GetCounter().GetValue()
				case "503":
					t.by503 += m.GetCounter().GetValue()
				}
			}
		case metricLatency:
			for _, m := range mf.GetMetric() {
				if !writes[label(m, "method")] {
					continue
				}
				for _, b := range m.GetHistogram().GetBucket() {
					t.writeHis[b.GetUpperBound()] += float64(b.GetCumulativeCount())
				}
				t.writeHis[math.Inf(1)] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return t
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// quantile estimates the q quantile of the observations between two
// readings of a cumulative histogram, interpolating linearly within the
// bucket as Prometheus's histogram_quantile does. NaN: none observed.
func quantile(q float64, before, after map[float64]float64) float64 {
	bounds := make([]float64, 0, len(after))
	for b := range after {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 {
		return math.NaN()
	}
	count := func(b float64) float64 { return max(after[b]-before[b], 0) }
	total := count(bounds[len(bounds)-1])
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range bounds {
		c := count(b)
		if c >= rank {
			if math.IsInf(b, 1) {
				return lower // beyond the last finite bound: report that bound
			}
			if c == below {
				return b
			}
			return lower + (b-lower)*(rank-below)/(c-below)
		}
		lower, below = b, c
	}
	return lower
}
