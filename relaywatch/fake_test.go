package relaywatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/testclock"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// fakeRelay serves com.atproto.sync.getHostStatus from a scripted answer,
// as indigo's relay does (handlers.go: 200 with the lexicon output, 404
// {"error":"HostNotFound"} for a host it does not know), and records
// requestCrawl calls.
type fakeRelay struct {
	*httptest.Server

	mu        sync.Mutex
	known     bool
	status    string
	seq       int64
	raw       string // served as is when set
	stall     bool   // getHostStatus never answers (until the client gives up)
	noMethod  bool   // getHostStatus is a plain 404 page
	hostnames []string

	crawls   chan string   // hostnames asked to crawl
	requests chan struct{} // one per getHostStatus, when non-nil
}

func newFakeRelay(t *testing.T) *fakeRelay {
	f := &fakeRelay{known: true, status: "active", crawls: make(chan string, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /xrpc/com.atproto.sync.getHostStatus", f.getHostStatus)
	mux.HandleFunc("POST /xrpc/com.atproto.sync.requestCrawl", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Hostname string `json:"hostname"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<10)).Decode(&body); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		f.crawls <- body.Hostname
		w.WriteHeader(http.StatusOK)
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeRelay) getHostStatus(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hostnames = append(f.hostnames, r.URL.Query().Get("hostname"))
	known, status, seq, raw, stall, requests := f.known, f.status, f.seq, f.raw, f.stall, f.requests
	f.mu.Unlock()
	if requests != nil {
		select {
		case requests <- struct{}{}:
		case <-r.Context().Done():
			return
		}
	}
	if f.noMethodNow() {
		http.NotFound(w, r)
		return
	}
	if stall {
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch {
	case raw != "":
		_, _ = io.WriteString(w, raw)
	case !known:
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":"HostNotFound","message":"host not found"}`)
	default:
		hostname := r.URL.Query().Get("hostname")
		_ = json.NewEncoder(w).Encode(map[string]any{"hostname": hostname, "seq": seq, "status": status, "accountCount": 3})
	}
}

// set scripts the next answers: the relay knows us, with this status and seq.
func (f *fakeRelay) set(status string, seq int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.known, f.status, f.seq, f.raw, f.stall = true, status, seq, "", false
}

func (f *fakeRelay) forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.known, f.raw, f.stall = false, "", false
}

func (f *fakeRelay) serveRaw(body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.raw, f.stall = body, false
}

func (f *fakeRelay) noMethodNow() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.noMethod
}

func (f *fakeRelay) lacksMethod() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noMethod = true
}

func (f *fakeRelay) stalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stall = true
}

func (f *fakeRelay) queried() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.hostnames...)
}

// name is the relay's host as the watch labels it.
func (f *fakeRelay) name() string { return strings.TrimPrefix(f.URL, "http://") }

// head is our scripted head seq.
type head struct {
	mu  sync.Mutex
	seq int64
	at  time.Time
	err error
}

func (h *head) set(seq int64, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq, h.at, h.err = seq, at, nil
}

func (h *head) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.err = err
}

func (h *head) Head(context.Context) (int64, time.Time, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq, h.at, h.err
}

// events is a scripted event log; it counts lookups.
type events struct {
	mu    sync.Mutex
	byseq map[int64]relaywatch.EventInfo
	calls int
}

func (e *events) EventAt(_ context.Context, seq int64) (relaywatch.EventInfo, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls++
	for s := seq; s < seq+1000; s++ {
		if ev, ok := e.byseq[s]; ok {
			return ev, nil
		}
	}
	return relaywatch.EventInfo{}, errors.New("no such event")
}

func (e *events) lookups() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

// logRecord is one captured log line.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]any
}

// logs captures slog records.
type logs struct {
	mu      sync.Mutex
	records []logRecord
}

type logHandler struct {
	l     *logs
	attrs []slog.Attr
}

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]any{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Any()
		return true
	})
	h.l.mu.Lock()
	h.l.records = append(h.l.records, rec)
	h.l.mu.Unlock()
	return nil
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{l: h.l, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h logHandler) WithGroup(string) slog.Handler { return h }

func (l *logs) logger() *slog.Logger { return slog.New(logHandler{l: l}) }

// at lists the records of one level, optionally only those about relay.
func (l *logs) at(level slog.Level, relay string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.records {
		if r.level == level && (relay == "" || r.attrs["relay"] == relay) {
			out = append(out, r)
		}
	}
	return out
}

// incidents collects what the Alerter heard.
type incidents struct {
	mu  sync.Mutex
	got []relaywatch.Incident
}

func (a *incidents) Alert(i relaywatch.Incident) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, i)
}

func (a *incidents) all() []relaywatch.Incident {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]relaywatch.Incident(nil), a.got...)
}

// metric reads one series' value from reg (NaN-free: -1 when absent).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				if m.GetGauge() != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

// env is one watch over fake relays, with every input scripted.
type env struct {
	w      *relaywatch.Watch
	clock  *testclock.Clock
	head   *head
	events *events
	logs   *logs
	alerts *incidents
	reg    *prometheus.Registry
}

func newEnv(t *testing.T, cfg relaywatch.Config, relays ...*fakeRelay) *env {
	t.Helper()
	e := &env{clock: testclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), head: &head{}, events: &events{byseq: map[int64]relaywatch.EventInfo{}}, logs: &logs{}, alerts: &incidents{}, reg: prometheus.NewRegistry()}
	if cfg.Hostname == "" {
		cfg.Hostname = "pds.example.com"
	}
	for _, f := range relays {
		cfg.Relays = append(cfg.Relays, f.URL)
	}
	cfg.Head, cfg.Events, cfg.Alerter = e.head, e.events, e.alerts
	cfg.Logger, cfg.Now, cfg.Registerer = e.logs.logger(), e.clock.Now, e.reg
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	w, err := relaywatch.New(cfg)
	require.NoError(t, err)
	e.w = w
	return e
}

// check runs one check and returns the report of relay f.
func (e *env) check(t *testing.T, f *fakeRelay) relaywatch.Report {
	t.Helper()
	for _, r := range e.w.CheckNow(context.Background()) {
		if r.Relay == f.name() {
			return r
		}
	}
	t.Fatalf("no report for relay %s", f.name())
	return relaywatch.Report{}
}

// state reads the relay's 0/1 gauge for s.
func (e *env) state(t *testing.T, f *fakeRelay, s relaywatch.State) float64 {
	return metric(t, e.reg, "bulwark_relay_state", map[string]string{"relay": f.name(), "state": string(s)})
}
