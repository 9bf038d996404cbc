package relaytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	relaypkg "github.com/bluesky-social/indigo/cmd/relay/relay"
	relaytesting "github.com/bluesky-social/indigo/cmd/relay/testing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/alert"
	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/relaywatch"
	"github.com/bulwark-pds/bulwark/repo"
)

// hostStatusServer answers com.atproto.sync.getHostStatus from indigo's
// relay's own record of a host, as its service does (the test harness
// serves only subscribeRepos): 404 HostNotFound for a host it does not
// know.
func hostStatusServer(t *testing.T, r *relaypkg.Relay) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		host, err := r.GetHost(req.Context(), req.URL.Query().Get("hostname"))
		if errors.Is(err, relaypkg.ErrHostNotFound) || req.URL.Path != "/xrpc/com.atproto.sync.getHostStatus" {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":"HostNotFound","message":"host not found"}`))
			return
		}
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":"DatabaseError"}`))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"hostname": host.Hostname, "seq": host.LastSeq, "status": host.Status, "accountCount": host.AccountCount,
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// webhookReceiver collects the alerts POSTed to it.
type webhookReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	alerts []alert.Alert
}

func newWebhookReceiver(t *testing.T) *webhookReceiver {
	r := &webhookReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var a alert.Alert
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&a); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.alerts = append(r.alerts, a)
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *webhookReceiver) find(kind string) *alert.Alert {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.alerts {
		if r.alerts[i].Kind == kind {
			return &r.alerts[i]
		}
	}
	return nil
}

// TestRelayWatchThenConsoleRepair replays the incident with indigo's relay
// subscribed to Bulwark, the #sync fallback off: a #commit is stored over
// the relay's frame limit and the relay stops at it. Within two watch
// intervals Bulwark's relay watch logs the warning naming the relay, its
// seq and the repair command, the lag metric shows it, and the alert
// webhook gets the alert. The operator then repairs the event from the
// console (log in, confirmation page, CSRF token), the relay ingests the
// #sync and what follows, and the watch logs the recovery.
//
// The relay stores its cursor every 4 s (its flusher) and when a connection
// ends after progress (slurper.go:363-374). The flusher is stopped here as
// in TestIndigoRelayResumesAfterRewriteAsSync (it races with indigo's
// redials under -race), so after the repair Bulwark's firehose is closed,
// as a restart would, to make the relay store how far it got; it stores
// one event behind what it processed (its scheduler counts an event done
// after the callback that records the seq).
func TestRelayWatchThenConsoleRepair(t *testing.T) {
	if testing.Short() {
		t.Skip("runs indigo's relay against Bulwark until it is stuck and repaired")
	}
	recordDefaultLog(t)
	ctx := context.Background()
	e := startRepairEnv(t, ctx, true)
	relay := relaytesting.MustSimpleRelay(e.dir, t.TempDir(), false)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, e.host, true, true))
	t.Cleanup(func() { _ = relay.Relay.Slurper.KillUpstreamConnection(context.Background(), e.host, false) })
	require.Eventually(t, func() bool { return e.hub.Live() == 1 }, 30*time.Second, 5*time.Millisecond)
	out := watchRelay(t, ctx, relay.Port)
	e.createAccount(t)
	before := e.post(t, ctx, "post 0").Rev
	require.Eventually(t, func() bool { return out.has("#commit " + before) }, 30*time.Second, 10*time.Millisecond)
	beforeSeq := e.seqOf(t, ctx, before)
	require.Eventually(t, func() bool {
		h, err := relay.Relay.GetHost(ctx, e.host)
		return err == nil && h.LastSeq == beforeSeq
	}, 30*time.Second, 20*time.Millisecond, "the relay flushes its cursor")
	require.NoError(t, relay.Relay.Slurper.Shutdown())

	w := startWatch(t, e, relay.Relay)
	relayName, watchLog, receiver := w.relay, w.log, w.receiver

	// The next commit is stored oversized before it is sequenced; the
	// account goes on writing.
	e.stopSeq()
	bad := e.post(t, ctx, "post 1")
	var id int64
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT id FROM events WHERE did = $1 AND rev = $2 AND seq IS NULL", e.did.String(), bad.Rev).Scan(&id))
	inflate(t, e.pool, "id = $1", id, 5_100_000)
	e.startSeq()
	later := e.post(t, ctx, "post 2")
	var laterSeq int64
	require.Eventually(t, func() bool {
		return e.pool.QueryRow(ctx, "SELECT seq FROM events WHERE did = $1 AND rev = $2 AND seq IS NOT NULL", e.did.String(), later.Rev).Scan(&laterSeq) == nil
	}, 30*time.Second, 5*time.Millisecond)
	badSeq := e.seqOf(t, ctx, bad.Rev)
	require.Equal(t, beforeSeq+1, badSeq)

	// The warning: the relay, its seq, the event and the repair command,
	// found on the second check at that seq (StuckChecks), so within two
	// intervals of the relay stopping (on a loaded machine, a check may
	// take longer than the interval: then the one after).
	require.Eventually(t, func() bool { return strings.Contains(watchLog.String(), "relay is stuck") }, 30*time.Second, 20*time.Millisecond, "the watch warns")
	warning := logLine(watchLog.String(), "relay is stuck")
	for _, want := range []string{
		"level=WARN", "relay=" + relayName, fmt.Sprintf("relay_seq=%d", badSeq-1), fmt.Sprintf("seq=%d", badSeq),
		fmt.Sprintf("bulwark admin firehose rewrite-as-sync --seq %d", badSeq), "breaks_limit=",
	} {
		require.Contains(t, warning, want)
	}
	// The second check at that seq, or a later one when a slow check left
	// the next closer than StuckFor.
	require.Regexp(t, `checks_at_seq=[2-9]`, warning)
	require.Equal(t, 1, strings.Count(watchLog.String(), "relay is stuck"), "warned once")
	require.Equal(t, float64(laterSeq-badSeq+1), lagOf(t, w.reg, relayName), "the lag metric")
	require.Eventually(t, func() bool { return receiver.find("relay_stuck") != nil }, 30*time.Second, 20*time.Millisecond, "the webhook gets the alert")
	got := receiver.find("relay_stuck")
	require.Equal(t, relayName, got.Subject)
	require.Equal(t, alert.SeverityCritical, got.Severity)
	require.Contains(t, got.Summary, fmt.Sprintf("stuck at seq %d", badSeq-1))
	require.Contains(t, got.Summary, fmt.Sprintf("rewrite-as-sync --seq %d", badSeq))

	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range e.hub.Health().Consumers() {
				t.Logf("consumer %+v, stuck %+v, failing %+v", c, c.Stuck, c.Failing)
			}
			t.Logf("bad seq %d; the relay re-emitted %v", badSeq, out.snapshot())
		}
	})
	// The operator repairs the event from the console.
	consoleRepair(t, e, w.watch, badSeq)

	// The relay's redial reads the #sync and the commit after it.
	require.Eventually(t, func() bool { return out.has("#commit " + later.Rev) }, 30*time.Second, 10*time.Millisecond, "the relay resumes")
	require.True(t, out.has("#sync "+bad.Rev))
	// Bulwark's firehose goes away, as on a restart: the relay's connection
	// ends after progress, so it stores how far it got. Its redials find
	// the firehose closed until its subscription is ended.
	e.hub.Close()
	require.Eventually(t, func() bool {
		h, err := relay.Relay.GetHost(ctx, e.host)
		return err == nil && h.LastSeq >= badSeq
	}, 30*time.Second, 20*time.Millisecond, "the relay stores how far it got")
	require.NoError(t, relay.Relay.Slurper.KillUpstreamConnection(ctx, e.host, false))
	require.Eventually(t, func() bool { return strings.Contains(watchLog.String(), "relay recovered") }, 30*time.Second, 20*time.Millisecond, "the watch logs the recovery")
	w.stop()
	recovered := logLine(watchLog.String(), "relay recovered")
	require.Contains(t, recovered, "level=INFO")
	require.Contains(t, recovered, "relay="+relayName)
	require.Contains(t, recovered, "was=stuck")
}

// watchRun is the relay watch, its metrics and the alert webhook, as serve
// wires them, watching one relay.
type watchRun struct {
	watch    *relaywatch.Watch
	relay    string // the relay's name in logs, metrics and alerts
	log      *syncbuf.Buffer
	reg      *prometheus.Registry
	receiver *webhookReceiver
	stop     func()
}

// startWatch runs a watch of indigo's relay r (its getHostStatus served by
// hostStatusServer) every 300 ms, stuck after two checks (and 100 ms).
func startWatch(t *testing.T, e *repairEnv, r *relaypkg.Relay) *watchRun {
	t.Helper()
	statusSrv := hostStatusServer(t, r)
	w := &watchRun{relay: strings.TrimPrefix(statusSrv.URL, "http://"), log: &syncbuf.Buffer{}, reg: prometheus.NewRegistry(), receiver: newWebhookReceiver(t)}
	hook, err := alert.New(alert.Config{URL: w.receiver.URL, Host: e.host, Logger: quiet})
	require.NoError(t, err)
	head, events := console.WatchSources(eventlog.NewLog(e.pool))
	w.watch, err = relaywatch.New(relaywatch.Config{
		Hostname: e.host, Relays: []string{statusSrv.URL}, Head: head, Events: events,
		Alerter: relaywatch.AlerterFunc(func(inc relaywatch.Incident) {
			hook.Send(alert.Alert{Kind: inc.Kind, Subject: inc.Relay, Severity: alert.Severity(inc.Severity), Summary: inc.Summary, Details: inc.Report})
		}),
		Interval: 300 * time.Millisecond, StuckChecks: 2, StuckFor: 100 * time.Millisecond, Timeout: 5 * time.Second, Registerer: w.reg,
		Logger: slog.New(slog.NewTextHandler(w.log, nil)),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.watch.Run(ctx) })
	wg.Go(func() { _ = hook.Run(ctx) })
	w.stop = func() { cancel(); wg.Wait() }
	t.Cleanup(w.stop)
	return w
}

// consoleRepair rewrites the event at seq as #sync through the console,
// as an operator with a browser would: log in, see the stuck relay, open
// the confirmation page, post the form with its CSRF token.
func consoleRepair(t *testing.T, e *repairEnv, watch *relaywatch.Watch, seq int64) {
	t.Helper()
	c, err := console.New(console.Config{
		AdminPassword: e.password, SessionSecret: []byte(strings.Repeat("s", 32)),
		Log: eventlog.NewLog(e.pool), Sync: repo.SyncEvent, DB: e.pool, Watch: watch, Health: e.hub.Health(), Logger: quiet,
	})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar}
	get := func(path string) string {
		resp, err := client.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		return string(body)
	}
	post := func(path string, form url.Values) string {
		resp, err := client.PostForm(srv.URL+path, form)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		return string(body)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	login := get(console.Prefix + "login")
	overview := post(console.Prefix+"login", url.Values{"csrf": {csrf.FindStringSubmatch(login)[1]}, "password": {e.password}})
	require.Contains(t, overview, `class="state">stuck<`)
	require.Contains(t, overview, fmt.Sprintf(`firehose/event/%d"`, seq))
	confirm := get(fmt.Sprintf("%sfirehose/event/%d/confirm?action=rewrite", console.Prefix, seq))
	done := post(fmt.Sprintf("%sfirehose/event/%d/repair", console.Prefix, seq), url.Values{
		"csrf": {csrf.FindStringSubmatch(confirm)[1]}, "action": {"rewrite"}, "reason": {"relay stuck on an oversized commit"},
	})
	require.Contains(t, done, "Done.")
}

// logLine is the first line of logs containing s.
func logLine(logs, s string) string {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// lagOf is bulwark_relay_seq_lag of relay in reg.
func lagOf(t *testing.T, reg *prometheus.Registry, relay string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "bulwark_relay_seq_lag" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "relay" && l.GetValue() == relay {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no bulwark_relay_seq_lag for %s", relay)
	return 0
}
