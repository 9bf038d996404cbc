package relaywatch

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for Config.
const (
	DefaultInterval      = time.Minute
	DefaultTimeout       = 10 * time.Second
	DefaultBehindEvents  = 10_000
	DefaultBehindFor     = 5 * time.Minute
	DefaultStuckChecks   = 2
	DefaultStuckFor      = 30 * time.Second
	DefaultCrawlInterval = 20 * time.Minute
	DefaultMaxObserved   = 16
)

// headHistory bounds the head observations kept to date a relay's oldest
// unread event (one per check at most: eight hours at the default interval).
const headHistory = 512

var (
	// ErrInvalidHostname means Config.Hostname is not a host name.
	ErrInvalidHostname = errors.New("invalid hostname")
	// ErrInvalidRelay means a relay is not a host name or an http(s) base URL.
	ErrInvalidRelay = errors.New("invalid relay")
)

// HeadReader reports this server's newest sequenced event: its seq and
// when it was written (zero: unknown, taken as the time of the check).
type HeadReader interface {
	Head(ctx context.Context) (seq int64, at time.Time, err error)
}

// HeadFunc adapts a function to HeadReader.
type HeadFunc func(ctx context.Context) (int64, time.Time, error)

// Head calls f.
func (f HeadFunc) Head(ctx context.Context) (int64, time.Time, error) { return f(ctx) }

// EventInfo describes one stored event for the operator.
type EventInfo struct {
	Seq  int64  `json:"seq"`
	Kind string `json:"kind"`
	DID  string `json:"did,omitempty"`
	// Size is the event's frame in bytes.
	Size int `json:"size"`
	// BrokenLimit names the protocol limit the event breaks ("" if none).
	BrokenLimit string `json:"brokenLimit,omitempty"`
}

// EventReader describes events. EventAt returns the first event still
// served whose seq is at least seq (invalidated events leave gaps), or an
// error when there is none.
type EventReader interface {
	EventAt(ctx context.Context, seq int64) (EventInfo, error)
}

// EventFunc adapts a function to EventReader.
type EventFunc func(ctx context.Context, seq int64) (EventInfo, error)

// EventAt calls f.
func (f EventFunc) EventAt(ctx context.Context, seq int64) (EventInfo, error) { return f(ctx, seq) }

// Config tunes a Watch. Only Hostname is required.
type Config struct {
	// Hostname is this server's host name as relays know it: the
	// --hostname setting, e.g. "pds.example.com" ("localhost:PORT" for a
	// relay on the same machine).
	Hostname string
	// Relays are the relays' base URLs (https://bsky.network), checked
	// from the start and never forgotten.
	Relays []string
	// Head reports our newest seq. Nil: lag is not judged, only what the
	// relays say of themselves.
	Head HeadReader
	// Events describes the events after a relay's seq when it enters
	// behind or stuck (nil: the warning names the seq only).
	Events EventReader
	// Alerter hears of relays entering stuck, ahead, throttled or banned.
	Alerter Alerter
	// RequestCrawl asks the relay at relayURL to crawl this server again
	// (default: POST com.atproto.sync.requestCrawl with Client).
	RequestCrawl func(ctx context.Context, relayURL string) error
	// Client makes the calls to relays (default: a plain client; pass the
	// server's outbound client).
	Client *http.Client
	// Interval is the time between checks in Run (default 1 min).
	Interval time.Duration
	// Timeout bounds each call: a relay query, a crawl request, Head and
	// the event lookups of one warning (default 10 s).
	Timeout time.Duration
	// BehindEvents: a relay trailing our head by more seqs than this is
	// behind (default 10,000).
	BehindEvents int64
	// BehindFor: a relay whose oldest unread event was written longer ago
	// than this is behind (default 5 min).
	BehindFor time.Duration
	// StuckChecks: a relay reporting the same seq on this many checks in a
	// row while newer events exist, the first of them for at least
	// StuckFor, is stuck (default 2: stuck on the second check after our
	// head passed it, within two intervals).
	StuckChecks int
	// StuckFor: how long, at least, the first event after a stuck relay's
	// seq has existed (default 30 s). Relays save their position every few
	// seconds (indigo's relay every 4 s) and report the saved one, so
	// between two saves a healthy relay reports the same seq while newer
	// events exist; with checks closer together than that, StuckChecks
	// alone would flag it.
	StuckFor time.Duration
	// CrawlInterval is the least time between two requestCrawl calls to
	// one relay (default 20 min, as the reference PDS).
	CrawlInterval time.Duration
	// MaxObserved bounds the relays added by Observe; the least recently
	// observed is forgotten first (default 16).
	MaxObserved int
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Logger receives the warnings (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Watch checks relays. It is safe for concurrent use.
type Watch struct {
	cfg   Config
	log   *slog.Logger
	host  string // our hostname as sent to relays
	m     *metrics
	crawl func(ctx context.Context, relayURL string) error

	checkMu sync.Mutex // one check at a time
	headErr string     // last Head error, logged once per streak; checkMu held

	mu     sync.Mutex
	relays map[string]*relay // by name
	heads  []headObs         // increasing seq
}

// headObs is one reading of our head.
type headObs struct {
	ok  bool
	seq int64
	at  time.Time
}

// New returns a Watch for cfg. It fails on an invalid hostname or relay
// URL, or when the metrics cannot be registered.
func New(cfg Config) (*Watch, error) {
	host, err := normalizeHostname(cfg.Hostname)
	if err != nil {
		return nil, err
	}
	cfg = withDefaults(cfg)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	w := &Watch{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "relaywatch"),
		host:   host,
		m:      m,
		crawl:  cfg.RequestCrawl,
		relays: map[string]*relay{},
	}
	if w.crawl == nil {
		w.crawl = w.requestCrawl
	}
	now := cfg.Now()
	for _, raw := range cfg.Relays {
		base, name, err := parseRelay(raw)
		if err != nil {
			return nil, err
		}
		w.relays[name] = &relay{url: base, name: name, configured: true, state: StatePending, since: now}
		w.m.setState(name, StatePending)
	}
	return w, nil
}

func withDefaults(cfg Config) Config {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.BehindEvents <= 0 {
		cfg.BehindEvents = DefaultBehindEvents
	}
	if cfg.BehindFor <= 0 {
		cfg.BehindFor = DefaultBehindFor
	}
	if cfg.StuckChecks <= 0 {
		cfg.StuckChecks = DefaultStuckChecks
	}
	if cfg.StuckFor <= 0 {
		cfg.StuckFor = DefaultStuckFor
	}
	if cfg.CrawlInterval <= 0 {
		cfg.CrawlInterval = DefaultCrawlInterval
	}
	if cfg.MaxObserved <= 0 {
		cfg.MaxObserved = DefaultMaxObserved
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// Observe adds a relay seen subscribing to our firehose (a host name or a
// base URL; a bare "localhost:PORT" means http), to be checked from the
// next check on. Configured relays do not count towards MaxObserved.
func (w *Watch) Observe(host string) error {
	base, name, err := parseRelay(host)
	if err != nil {
		return err
	}
	now := w.cfg.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if r, ok := w.relays[name]; ok {
		r.observedAt = now
		return nil
	}
	var observed []*relay
	for _, r := range w.relays {
		if !r.configured {
			observed = append(observed, r)
		}
	}
	if len(observed) >= w.cfg.MaxObserved {
		sort.Slice(observed, func(i, j int) bool { return observed[i].observedAt.Before(observed[j].observedAt) })
		for _, r := range observed[:len(observed)-w.cfg.MaxObserved+1] {
			delete(w.relays, r.name)
			w.m.forget(r.name)
		}
	}
	w.relays[name] = &relay{url: base, name: name, observedAt: now, state: StatePending, since: now}
	w.m.setState(name, StatePending)
	w.log.Info("watching a relay seen subscribing", "relay", name, "url", base)
	return nil
}

// Run checks every relay at once and then every Interval until ctx ends.
func (w *Watch) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		w.CheckNow(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// CheckNow checks every relay (concurrently, each call bounded by
// Timeout), acts on what changed and returns the new Snapshot. Checks do
// not overlap: a second caller waits for the first.
func (w *Watch) CheckNow(ctx context.Context) []Report {
	w.checkMu.Lock()
	defer w.checkMu.Unlock()
	relays := w.current()
	obs := make([]observation, len(relays))
	var wg sync.WaitGroup
	for i, r := range relays {
		wg.Go(func() { obs[i] = w.query(ctx, r.url) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		// Shutting down: the failures say nothing of the relays.
		return w.Snapshot()
	}
	// Our head is read after the relays answered, so that nothing a relay
	// reports can be newer than it.
	head := w.readHead(ctx)
	now := w.cfg.Now()
	steps := make([]step, len(relays))
	w.mu.Lock()
	w.noteHead(head, now)
	for i, r := range relays {
		steps[i] = w.apply(r, obs[i], head, now)
	}
	w.mu.Unlock()
	for i := range steps {
		wg.Go(func() { w.follow(ctx, &steps[i]) })
	}
	wg.Wait()
	return w.Snapshot()
}

// current lists the relays to check.
func (w *Watch) current() []*relay {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*relay, 0, len(w.relays))
	for _, r := range w.relays {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// readHead reads our head, bounded by Timeout. A failure is logged once
// per streak; the check then judges no lag.
func (w *Watch) readHead(ctx context.Context) headObs {
	if w.cfg.Head == nil {
		return headObs{}
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	seq, at, err := w.cfg.Head.Head(ctx)
	if err != nil {
		if w.headErr == "" {
			w.log.Warn("relay watch cannot read our head seq; relay lag is not judged until it can", "err", err)
		}
		w.headErr = err.Error()
		return headObs{}
	}
	w.headErr = ""
	return headObs{ok: true, seq: seq, at: at}
}

// noteHead remembers a head reading, to date relays' unread events. w.mu held.
func (w *Watch) noteHead(h headObs, now time.Time) {
	if !h.ok {
		return
	}
	if h.at.IsZero() || h.at.After(now) {
		h.at = now
	}
	n := len(w.heads)
	switch {
	case n > 0 && h.seq < w.heads[n-1].seq:
		// Our seq went back (a restored database): older readings mislead.
		w.heads = append(w.heads[:0], h)
	case n == 0 || h.seq > w.heads[n-1].seq:
		w.heads = append(w.heads, h)
		if len(w.heads) > headHistory {
			w.heads = append(w.heads[:0], w.heads[len(w.heads)-headHistory:]...)
		}
	}
}

// unreadAge is how long ago, at least, the first event after seq was
// written: the time of the first head reading past seq. w.mu held.
func (w *Watch) unreadAge(seq int64, now time.Time) time.Duration {
	i := sort.Search(len(w.heads), func(i int) bool { return w.heads[i].seq > seq })
	if i == len(w.heads) {
		return 0
	}
	return now.Sub(w.heads[i].at)
}

// Snapshot reports every relay, the worst first, then by name.
func (w *Watch) Snapshot() []Report {
	w.mu.Lock()
	out := make([]Report, 0, len(w.relays))
	for _, r := range w.relays {
		out = append(out, r.report())
	}
	w.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if a, b := severityRank[out[i].State], severityRank[out[j].State]; a != b {
			return a > b
		}
		return out[i].Relay < out[j].Relay
	})
	return out
}
