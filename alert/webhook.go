package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of alert Bulwark sends. Relay alerts take relaywatch's incident
// kinds (relay_stuck, relay_ahead, relay_throttled, relay_banned).
const (
	KindRelayStuck    = "relay_stuck"
	KindConsumerStuck = "consumer_stuck"
	KindOverloadStorm = "overload_storm"
)

// Severity says how urgent an alert is.
type Severity string

// Severities.
const (
	SeverityInfo     Severity = "info"
	SeverityWarning  Severity = "warning"
	SeverityCritical Severity = "critical"
)

// Defaults for Config.
const (
	DefaultQueueSize   = 64
	DefaultMaxAttempts = 5
	DefaultBackoff     = 5 * time.Second
	DefaultMaxBackoff  = 5 * time.Minute
	DefaultDedupWindow = 15 * time.Minute
	DefaultTimeout     = 10 * time.Second
)

// Bounds on what one alert carries.
const (
	maxKindBytes     = 64
	maxSubjectBytes  = 256
	maxIncidentBytes = 256
	maxSummaryBytes  = 2000
	maxDetailsBytes  = 32 << 10
	maxDedupKeys     = 1024
	maxReplyBytes    = 512
)

// StuckIncident names the incident of consumers stuck on the event at seq,
// for Alert.Incident: however many detectors and relays report it, it is
// one alert.
func StuckIncident(seq int64) string { return fmt.Sprintf("firehose-stuck:seq:%d", seq) }

// ErrInvalidURL means the webhook URL is not an absolute http(s) URL.
var ErrInvalidURL = errors.New("invalid alert webhook URL")

// Alert is one notification, and the JSON body of its POST.
type Alert struct {
	// Kind names what happened (KindRelayStuck, ...); required.
	Kind string `json:"kind"`
	// Subject is what it happened to (a relay's host, a consumer's
	// address); with Kind, the deduplication key, unless Incident is set.
	Subject string `json:"subject,omitempty"`
	// Incident, when set, names the incident the alert is about, and is
	// the deduplication key instead: alerts of any kind or subject about
	// one incident are one alert (the relay watch and consumer health both
	// see a relay stuck on an event: StuckIncident). Flapping or false
	// alarms about other incidents do not hold back a new one.
	Incident string   `json:"incident,omitempty"`
	Severity Severity `json:"severity"`
	// Summary is one line for a human.
	Summary string `json:"summary"`
	// Details is marshalled as a JSON object (a map or a struct with json
	// tags); over 32 KiB it is replaced by a note saying so.
	Details any `json:"details,omitempty"`
	// Time is when it happened (default: when sent).
	Time time.Time `json:"time"`
	// Host is this server (default Config.Host).
	Host string `json:"host"`
}

// Config tunes a Webhook. The zero value is a disabled webhook.
type Config struct {
	// URL receives each alert as a JSON POST (empty: alerts are dropped).
	// It is never logged: webhook URLs often carry a token.
	URL string
	// Format is the body's shape (default FormatAuto: a Slack or Discord
	// webhook gets a chat message, anything else the Alert as JSON).
	Format Format
	// Host names this server in every alert (the public hostname).
	Host string
	// Client makes the POSTs (default: a plain client; pass the server's
	// outbound client).
	Client *http.Client
	// QueueSize bounds alerts waiting for delivery; when full, new ones
	// are dropped and counted (default 64).
	QueueSize int
	// MaxAttempts bounds deliveries of one alert (default 5).
	MaxAttempts int
	// Backoff is the wait before the first retry, doubled for each next
	// one up to MaxBackoff (defaults 5 s, 5 min). A Retry-After from the
	// receiver lengthens it, up to MaxBackoff.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// DedupWindow: an alert of the same kind and subject as one accepted
	// less than this long ago is dropped (default 15 min).
	DedupWindow time.Duration
	// Timeout bounds each POST (default 10 s).
	Timeout time.Duration
	// Registerer receives bulwark_alerts_total (nil: not registered).
	Registerer prometheus.Registerer
	// Logger receives delivery failures (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// After waits between attempts (default time.After).
	After func(time.Duration) <-chan time.Time
}

// Stats counts what became of alerts.
type Stats struct {
	Sent         int64 `json:"sent"`
	Failed       int64 `json:"failed"`
	Dropped      int64 `json:"dropped"`
	Deduplicated int64 `json:"deduplicated"`
	Queued       int   `json:"queued"`
}

// Webhook delivers alerts. It is safe for concurrent use.
type Webhook struct {
	cfg     Config
	log     *slog.Logger
	queue   chan queued
	results *prometheus.CounterVec

	mu          sync.Mutex
	last        map[string]time.Time // dedup key -> accepted at
	stats       Stats
	overflowing bool // a drop was logged; cleared by the next accepted alert
}

type queued struct {
	kind, subject string
	body          []byte
}

// New returns a Webhook for cfg; it fails on a URL that is not absolute
// http(s), or when the metric cannot be registered.
func New(cfg Config) (*Webhook, error) {
	if cfg.URL != "" {
		u, err := url.Parse(cfg.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			// The URL itself stays out of the error: it may hold a token.
			return nil, ErrInvalidURL
		}
	}
	cfg = withDefaults(cfg)
	cfg.Format = ResolveFormat(cfg.Format, cfg.URL)
	w := &Webhook{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "alert"),
		queue: make(chan queued, cfg.QueueSize),
		last:  map[string]time.Time{},
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bulwark_alerts_total",
			Help: "Alerts by outcome: sent, failed (attempts exhausted), dropped (queue full), deduplicated.",
		}, []string{"result"}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(w.results); err != nil {
			return nil, fmt.Errorf("registering alert metrics: %w", err)
		}
	}
	return w, nil
}

func withDefaults(cfg Config) Config {
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.DedupWindow <= 0 {
		cfg.DedupWindow = DefaultDedupWindow
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
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
	if cfg.After == nil {
		cfg.After = time.After
	}
	return cfg
}

// Enabled says whether alerts go anywhere.
func (w *Webhook) Enabled() bool { return w != nil && w.cfg.URL != "" }

// Send queues a for delivery without blocking. It returns false when the
// alert is dropped: no webhook, no kind, a duplicate within DedupWindow,
// or a full queue.
func (w *Webhook) Send(a Alert) bool {
	if !w.Enabled() || a.Kind == "" {
		return false
	}
	now := w.cfg.Now()
	a.Kind, a.Subject, a.Summary = cut(a.Kind, maxKindBytes), cut(a.Subject, maxSubjectBytes), cut(a.Summary, maxSummaryBytes)
	a.Incident = cut(a.Incident, maxIncidentBytes)
	if a.Time.IsZero() {
		a.Time = now
	}
	if a.Host == "" {
		a.Host = w.cfg.Host
	}
	if a.Severity == "" {
		a.Severity = SeverityWarning
	}
	body, err := encodeAs(w.cfg.Format, a)
	if err != nil {
		w.log.Error("alert cannot be encoded", "kind", a.Kind, "subject", a.Subject, "err", err)
		return false
	}
	key := a.Kind + "\x00" + a.Subject
	if a.Incident != "" {
		key = "incident\x00" + a.Incident
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if at, ok := w.last[key]; ok && now.Sub(at) < w.cfg.DedupWindow {
		w.stats.Deduplicated++
		w.results.WithLabelValues("deduplicated").Inc()
		return false
	}
	select {
	case w.queue <- queued{kind: a.Kind, subject: a.Subject, body: body}:
	default:
		w.stats.Dropped++
		w.results.WithLabelValues("dropped").Inc()
		if !w.overflowing {
			w.overflowing = true
			w.log.Warn("alert queue is full: alerts are dropped until the webhook catches up", "kind", a.Kind, "subject", a.Subject, "queue", w.cfg.QueueSize)
		}
		return false
	}
	w.overflowing = false
	w.remember(key, now)
	return true
}

// remember records key as accepted at now, keeping at most maxDedupKeys.
// w.mu held.
func (w *Webhook) remember(key string, now time.Time) {
	if len(w.last) >= maxDedupKeys {
		oldest, oldestAt := "", now
		for k, at := range w.last {
			if now.Sub(at) >= w.cfg.DedupWindow {
				delete(w.last, k)
			} else if at.Before(oldestAt) {
				oldest, oldestAt = k, at
			}
		}
		if len(w.last) >= maxDedupKeys {
			delete(w.last, oldest)
		}
	}
	w.last[key] = now
}

// encode marshals a, replacing oversized or unmarshallable details by a note.
func encode(a Alert) ([]byte, error) {
	if a.Details != nil {
		d, err := json.Marshal(a.Details)
		switch {
		case err != nil:
			a.Details = map[string]string{"error": "details could not be encoded: " + cut(err.Error(), 200)}
		case len(d) > maxDetailsBytes:
			a.Details = map[string]any{"truncated": true, "bytes": len(d)}
		default:
			a.Details = json.RawMessage(d)
		}
	}
	return json.Marshal(a)
}

// Stats reports what became of alerts so far.
func (w *Webhook) Stats() Stats {
	if w == nil {
		return Stats{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Queued = len(w.queue)
	return s
}

// Run delivers queued alerts until ctx ends; alerts still queued then are
// lost.
func (w *Webhook) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case q := <-w.queue:
			w.deliver(ctx, q)
		}
	}
}

// Deliver delivers the alerts queued now, one after the other, and
// returns how many the receiver took.
func (w *Webhook) Deliver(ctx context.Context) int {
	n := 0
	for {
		select {
		case q := <-w.queue:
			if w.deliver(ctx, q) {
				n++
			}
		default:
			return n
		}
	}
}

// deliver POSTs one alert, retrying with backoff.
func (w *Webhook) deliver(ctx context.Context, q queued) bool {
	delay := w.cfg.Backoff
	var err error
	attempt := 0
	for attempt < w.cfg.MaxAttempts {
		attempt++
		var retry bool
		var wait time.Duration
		if retry, wait, err = w.post(ctx, q.body); err == nil {
			w.count(func(s *Stats) { s.Sent++ }, "sent")
			return true
		}
		if !retry || attempt == w.cfg.MaxAttempts {
			break
		}
		wait = min(max(wait, delay), w.cfg.MaxBackoff)
		select {
		case <-ctx.Done():
			return false
		case <-w.cfg.After(wait):
		}
		delay = min(delay*2, w.cfg.MaxBackoff)
	}
	if ctx.Err() != nil {
		return false
	}
	w.count(func(s *Stats) { s.Failed++ }, "failed")
	w.log.Warn("alert webhook did not take an alert", "kind", q.kind, "subject", q.subject, "attempts", attempt, "err", err)
	return false
}

func (w *Webhook) count(f func(*Stats), result string) {
	w.mu.Lock()
	f(&w.stats)
	w.mu.Unlock()
	w.results.WithLabelValues(result).Inc()
}

// post makes one attempt. It says whether a failure is worth retrying
// (network errors, 408, 429, 5xx) and how long the receiver asked to wait.
func (w *Webhook) post(ctx context.Context, body []byte) (retry bool, wait time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return false, 0, errors.New("building the request failed")
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.cfg.Client.Do(req)
	if err != nil {
		// A *url.Error names the URL, which may hold a token: keep its cause only.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return true, 0, err
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return false, 0, nil
	}
	err = fmt.Errorf("webhook answered %d: %s", resp.StatusCode, cut(string(bytes.TrimSpace(reply)), 200))
	retry = resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
	if secs, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && secs > 0 {
		wait = time.Duration(secs) * time.Second
	}
	return retry, wait, err
}

// cut bounds s to n bytes on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
