package relaywatch_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/relaywatch"
)

const oversize = "frame is 6000000 bytes; relays drop the connection above 5000000"

// A relay whose seq stays put while our head moves is stuck after
// StuckChecks checks: one warning naming the relay, its seq, the event it
// cannot pass and the repair command; one alert; the metrics say so; and
// when it catches up, one info line.
func TestStuckWarnsOnceAndRecovers(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{StuckChecks: 3}, f)
	e.events.byseq[101] = relaywatch.EventInfo{Seq: 101, Kind: "commit", DID: "did:plc:big", Size: 6_000_000, BrokenLimit: oversize}
	e.events.byseq[102] = relaywatch.EventInfo{Seq: 102, Kind: "commit", DID: "did:plc:ok", Size: 900}

	e.head.set(100, e.clock.Now())
	f.set("active", 100)
	require.Equal(t, relaywatch.StateHealthy, e.check(t, f).State)

	e.head.set(110, e.clock.Now())
	for i := 1; i < 3; i++ {
		e.clock.Advance(time.Minute)
		r := e.check(t, f)
		require.Equal(t, relaywatch.StateHealthy, r.State, "check %d", i)
		require.Equal(t, i, r.SameSeqChecks)
	}
	require.Zero(t, e.events.lookups(), "events are described only on entering stuck or behind")
	require.Empty(t, e.logs.at(slog.LevelWarn, ""))

	e.clock.Advance(time.Minute)
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateStuck, r.State)
	require.Equal(t, int64(101), r.Event.Seq)
	want := `bulwark admin firehose rewrite-as-sync --seq 101 --reason "relay ` + f.name() + ` stuck at seq 100"`
	require.Equal(t, want, r.Command)

	warns := e.logs.at(slog.LevelWarn, f.name())
	require.Len(t, warns, 1)
	require.Contains(t, warns[0].msg, "stuck")
	require.Equal(t, int64(100), warns[0].attrs["relay_seq"])
	require.Equal(t, int64(101), warns[0].attrs["seq"])
	require.Equal(t, "commit", warns[0].attrs["kind"])
	require.Equal(t, int64(6_000_000), warns[0].attrs["size"])
	require.Equal(t, oversize, warns[0].attrs["breaks_limit"])
	require.Equal(t, want, warns[0].attrs["command"])

	alerts := e.alerts.all()
	require.Len(t, alerts, 1)
	require.Equal(t, "relay_stuck", alerts[0].Kind)
	require.Equal(t, "critical", alerts[0].Severity)
	require.Equal(t, f.name(), alerts[0].Relay)
	require.Contains(t, alerts[0].Summary, "rewrite-as-sync --seq 101")

	require.Equal(t, 1.0, e.state(t, f, relaywatch.StateStuck))
	require.Equal(t, 0.0, e.state(t, f, relaywatch.StateHealthy))
	require.NoError(t, testutil.GatherAndCompare(e.reg, strings.NewReader(`
# HELP bulwark_relay_seq_lag Our head seq minus the last seq the relay reported for us (negative: the relay is ahead).
# TYPE bulwark_relay_seq_lag gauge
bulwark_relay_seq_lag{relay="`+f.name()+`"} 10
# HELP bulwark_relay_checks_total getHostStatus calls to the relay by result (ok, host_not_found, error, timeout).
# TYPE bulwark_relay_checks_total counter
bulwark_relay_checks_total{relay="`+f.name()+`",result="ok"} 4
`), "bulwark_relay_seq_lag", "bulwark_relay_checks_total"))

	// Still stuck: nothing more is said, nothing more is looked up.
	lookups := e.events.lookups()
	e.clock.Advance(time.Minute)
	require.Equal(t, relaywatch.StateStuck, e.check(t, f).State)
	require.Len(t, e.logs.at(slog.LevelWarn, ""), 1)
	require.Len(t, e.alerts.all(), 1)
	require.Equal(t, lookups, e.events.lookups())

	// The operator repaired it; the relay catches up.
	f.set("active", 110)
	e.clock.Advance(time.Minute)
	r = e.check(t, f)
	require.Equal(t, relaywatch.StateHealthy, r.State)
	require.Empty(t, r.Command)
	infos := e.logs.at(slog.LevelInfo, f.name())
	require.Len(t, infos, 1)
	require.Equal(t, "relay recovered", infos[0].msg)
	require.Equal(t, relaywatch.StateStuck, infos[0].attrs["was"])
	require.Equal(t, 1.0, e.state(t, f, relaywatch.StateHealthy))
	require.Equal(t, 0.0, e.state(t, f, relaywatch.StateStuck))
	require.Equal(t, 0.0, metric(t, e.reg, "bulwark_relay_seq_lag", map[string]string{"relay": f.name()}))

	e.clock.Advance(time.Minute)
	e.check(t, f)
	require.Len(t, e.logs.at(slog.LevelInfo, f.name()), 1)
	require.Len(t, e.logs.at(slog.LevelWarn, ""), 1)
}

// A relay stuck on a sound event is sent a fresh #sync of its repo; the
// events after the relay's seq are searched for one that breaks a limit.
func TestStuckOnSoundEventSuggestsEmitSync(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{StuckChecks: 2}, f)
	e.events.byseq[50] = relaywatch.EventInfo{Seq: 50, Kind: "commit", DID: "did:plc:read", Size: 800}
	e.events.byseq[51] = relaywatch.EventInfo{Seq: 51, Kind: "commit", DID: "did:plc:alice", Size: 800}
	e.events.byseq[53] = relaywatch.EventInfo{Seq: 53, Kind: "sync", DID: "did:plc:bob", Size: 700}
	e.head.set(60, e.clock.Now())
	f.set("active", 50)
	e.check(t, f)
	e.clock.Advance(time.Minute)
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateStuck, r.State)
	require.Equal(t, int64(51), r.Event.Seq)
	require.Equal(t, `bulwark admin firehose emit-sync --did did:plc:alice --reason "relay `+f.name()+` stuck at seq 50"`, r.Command)
	require.Equal(t, 3, e.events.lookups(), "51, 53, then nothing past it")

	// With a limit broken a little further on, that event is the culprit.
	e.events.byseq[52] = relaywatch.EventInfo{Seq: 52, Kind: "commit", DID: "did:plc:carol", Size: 2_500_000, BrokenLimit: "blocks are 2400000 bytes"}
	f.set("active", 40)
	e.check(t, f)
	e.clock.Advance(time.Minute)
	f.set("active", 50)
	e.check(t, f)
	e.clock.Advance(time.Minute)
	r = e.check(t, f)
	require.Equal(t, relaywatch.StateStuck, r.State)
	require.Equal(t, int64(52), r.Event.Seq)
	require.Contains(t, r.Command, "rewrite-as-sync --seq 52")
}

// Behind by count: the relay moves but trails our head by more than
// BehindEvents. Behind by time: it trails by few events, but the oldest it
// has not read was written more than BehindFor ago.
func TestBehindAfterLag(t *testing.T) {
	t.Run("events", func(t *testing.T) {
		f := newFakeRelay(t)
		e := newEnv(t, relaywatch.Config{BehindEvents: 50}, f)
		e.events.byseq[120] = relaywatch.EventInfo{Seq: 120, Kind: "commit", DID: "did:plc:read", Size: 1100}
		e.events.byseq[121] = relaywatch.EventInfo{Seq: 121, Kind: "commit", DID: "did:plc:alice", Size: 1200}
		e.head.set(150, e.clock.Now())
		f.set("active", 110)
		require.Equal(t, relaywatch.StateHealthy, e.check(t, f).State)
		e.head.set(200, e.clock.Now())
		f.set("active", 120)
		r := e.check(t, f)
		require.Equal(t, relaywatch.StateBehind, r.State)
		require.Equal(t, int64(80), *r.Lag)
		require.Equal(t, int64(121), r.Event.Seq)
		warns := e.logs.at(slog.LevelWarn, f.name())
		require.Len(t, warns, 1)
		require.Contains(t, warns[0].msg, "behind")
		require.Equal(t, int64(120), warns[0].attrs["relay_seq"])
		require.Contains(t, warns[0].attrs["command"], "emit-sync --did did:plc:alice")
		require.Equal(t, 80.0, metric(t, e.reg, "bulwark_relay_seq_lag", map[string]string{"relay": f.name()}))
		require.Empty(t, e.alerts.all(), "behind is a warning in the log, not an alert")

		f.set("active", 190)
		require.Equal(t, relaywatch.StateHealthy, e.check(t, f).State)
		require.Len(t, e.logs.at(slog.LevelInfo, f.name()), 1)
	})
	t.Run("time", func(t *testing.T) {
		f := newFakeRelay(t)
		e := newEnv(t, relaywatch.Config{BehindFor: 5 * time.Minute}, f)
		written := e.clock.Now()
		e.head.set(110, written)
		for seq := int64(100); seq < 106; seq++ {
			f.set("active", seq)
			r := e.check(t, f)
			require.Equal(t, relaywatch.StateHealthy, r.State, "seq %d", seq)
			e.clock.Advance(time.Minute)
		}
		f.set("active", 106)
		r := e.check(t, f)
		require.Equal(t, relaywatch.StateBehind, r.State)
		require.Equal(t, int64(6*60), r.UnreadSeconds)
		require.Len(t, e.logs.at(slog.LevelWarn, f.name()), 1)
	})
}

// What a relay says of itself is reported plainly, and alerted.
func TestThrottledAndBanned(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{}, f)
	e.head.set(10, e.clock.Now())
	f.set("throttled", 10)
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateThrottled, r.State)
	require.Equal(t, "throttled", r.RelayStatus)
	f.set("banned", 10)
	require.Equal(t, relaywatch.StateBanned, e.check(t, f).State)
	require.Equal(t, 1.0, e.state(t, f, relaywatch.StateBanned))
	require.Equal(t, 0.0, e.state(t, f, relaywatch.StateThrottled))

	warns := e.logs.at(slog.LevelWarn, f.name())
	require.Len(t, warns, 2)
	require.Contains(t, warns[0].msg, "throttles")
	require.Contains(t, warns[1].msg, "banned")
	alerts := e.alerts.all()
	require.Len(t, alerts, 2)
	require.Equal(t, "relay_throttled", alerts[0].Kind)
	require.Equal(t, "warning", alerts[0].Severity)
	require.Equal(t, "relay_banned", alerts[1].Kind)
	require.Equal(t, "critical", alerts[1].Severity)
}

// A relay that does not know us is asked to crawl, at most once per
// CrawlInterval; once it knows us, it is healthy.
func TestHostNotFoundRequestsCrawl(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{Hostname: "PDS.Example.com", CrawlInterval: 20 * time.Minute}, f)
	e.head.set(5, e.clock.Now())
	f.forget()
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateUnknown, r.State)
	require.Equal(t, "pds.example.com", <-f.crawls)
	require.Equal(t, []string{"pds.example.com"}, f.queried())
	require.Equal(t, 1.0, metric(t, e.reg, "bulwark_relay_checks_total", map[string]string{"relay": f.name(), "result": "host_not_found"}))

	e.clock.Advance(time.Minute)
	e.check(t, f)
	require.Empty(t, f.crawls, "asked again within the interval")
	e.clock.Advance(20 * time.Minute)
	e.check(t, f)
	require.Equal(t, "pds.example.com", <-f.crawls)

	f.set("active", 5)
	require.Equal(t, relaywatch.StateHealthy, e.check(t, f).State)
	require.Empty(t, e.logs.at(slog.LevelWarn, ""))
	require.Len(t, e.alerts.all(), 0)

	// An idle or offline relay knows us but is not reading: asked again.
	e.clock.Advance(20 * time.Minute)
	f.set("offline", 5)
	require.Equal(t, relaywatch.StateDisconnected, e.check(t, f).State)
	require.Equal(t, "pds.example.com", <-f.crawls)
}

// A 404 without the XRPC error (a server without the method) is not taken
// for "does not know us": no crawl request.
func TestPlain404IsUnreachable(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{}, f)
	f.lacksMethod()
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateUnreachable, r.State)
	require.Contains(t, r.Error, "404")
	require.Empty(t, f.crawls)
}

// A stalled relay costs one Timeout: the check returns, the other relay is
// judged, and the stalled one is unreachable.
func TestStalledRelayIsBounded(t *testing.T) {
	stalled, fine := newFakeRelay(t), newFakeRelay(t)
	// The bound is generous so that the fine relay answers within it
	// however loaded the machine; the stalled one never answers.
	e := newEnv(t, relaywatch.Config{Timeout: 2 * time.Second}, stalled, fine)
	e.head.set(7, e.clock.Now())
	stalled.stalls()
	fine.set("active", 7)
	reports := e.w.CheckNow(context.Background())
	require.Len(t, reports, 2)
	byName := map[string]relaywatch.Report{}
	for _, r := range reports {
		byName[r.Relay] = r
	}
	require.Equal(t, relaywatch.StateUnreachable, byName[stalled.name()].State)
	require.Contains(t, byName[stalled.name()].Error, "no answer within 2s")
	require.Equal(t, relaywatch.StateHealthy, byName[fine.name()].State)
	require.Equal(t, 1.0, metric(t, e.reg, "bulwark_relay_checks_total", map[string]string{"relay": stalled.name(), "result": "timeout"}))
	warns := e.logs.at(slog.LevelWarn, stalled.name())
	require.Len(t, warns, 1)
	require.Equal(t, reports[0].Relay, stalled.name(), "the worst first")
}

// Answers are bounded in size and must be the lexicon's JSON.
func TestBadAnswers(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{}, f)
	f.serveRaw(`{"hostname":"x","seq":` + strings.Repeat("1", 20<<10) + `}`)
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateUnreachable, r.State)
	require.Contains(t, r.Error, "over 16384 bytes")
	f.serveRaw(`<html>`)
	r = e.check(t, f)
	require.Equal(t, relaywatch.StateUnreachable, r.State)
	require.Contains(t, r.Error, "not the lexicon's JSON")
	f.serveRaw(`{"hostname":"x","seq":3,"status":"` + strings.Repeat("x", 5000) + `"}`)
	r = e.check(t, f)
	require.LessOrEqual(t, len(r.RelayStatus), 210)
}

// A relay whose seq is above our head will refuse our stream until our
// sequence is raised: the command says how, even while it is idle.
func TestAheadSuggestsRaiseSeq(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{}, f)
	e.head.set(40, e.clock.Now())
	f.set("idle", 900)
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateAhead, r.State)
	require.Equal(t, int64(-860), *r.Lag)
	require.Equal(t, `bulwark admin firehose raise-seq --floor 901 --reason "relay ahead of our sequence"`, r.Command)
	require.Equal(t, "pds.example.com", <-f.crawls, "idle: asked to come back")
	require.Equal(t, -860.0, metric(t, e.reg, "bulwark_relay_seq_lag", map[string]string{"relay": f.name()}))
	alerts := e.alerts.all()
	require.Len(t, alerts, 1)
	require.Equal(t, "relay_ahead", alerts[0].Kind)
}

// A relay flapping between stuck and unreachable at the same seq is
// warned of once per state.
func TestFlappingWarnsOnce(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{StuckChecks: 2}, f)
	e.head.set(20, e.clock.Now())
	f.set("active", 10)
	e.check(t, f)
	e.clock.Advance(time.Minute)
	require.Equal(t, relaywatch.StateStuck, e.check(t, f).State)
	for range 3 {
		f.serveRaw("nonsense")
		require.Equal(t, relaywatch.StateUnreachable, e.check(t, f).State)
		f.set("active", 10)
		require.Equal(t, relaywatch.StateStuck, e.check(t, f).State)
	}
	warns := e.logs.at(slog.LevelWarn, f.name())
	require.Len(t, warns, 2, "one for stuck, one for unreachable")
	require.Len(t, e.alerts.all(), 1)
}

// Without our head, lag is not judged and what was judged stands.
func TestHeadFailureKeepsState(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{StuckChecks: 2}, f)
	e.head.set(20, e.clock.Now())
	f.set("active", 10)
	e.check(t, f)
	e.clock.Advance(time.Minute)
	require.Equal(t, relaywatch.StateStuck, e.check(t, f).State)
	e.head.fail(errors.New("database down"))
	require.Equal(t, relaywatch.StateStuck, e.check(t, f).State)
	require.Equal(t, relaywatch.StateStuck, e.check(t, f).State)
	headWarns := 0
	for _, r := range e.logs.at(slog.LevelWarn, "") {
		if strings.Contains(r.msg, "head seq") {
			headWarns++
		}
	}
	require.Equal(t, 1, headWarns)
}

// Observed relays are bounded; the least recently observed goes first,
// with its series; configured relays stay.
func TestObserveBounded(t *testing.T) {
	configured := newFakeRelay(t)
	a, b, c := newFakeRelay(t), newFakeRelay(t), newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{MaxObserved: 2}, configured)
	e.head.set(1, e.clock.Now())
	for _, f := range []*fakeRelay{configured, a, b, c} {
		f.set("active", 1)
	}
	require.NoError(t, e.w.Observe(a.URL))
	e.clock.Advance(time.Second)
	require.NoError(t, e.w.Observe(b.URL))
	e.clock.Advance(time.Second)
	require.NoError(t, e.w.Observe(a.URL)) // a is now the most recent
	e.w.CheckNow(context.Background())
	require.Equal(t, 1.0, e.state(t, b, relaywatch.StateHealthy))

	e.clock.Advance(time.Second)
	require.NoError(t, e.w.Observe(c.URL))
	names := map[string]bool{}
	for _, r := range e.w.CheckNow(context.Background()) {
		names[r.Relay] = r.Configured
	}
	require.Equal(t, map[string]bool{configured.name(): true, a.name(): false, c.name(): false}, names)
	require.Equal(t, -1.0, e.state(t, b, relaywatch.StateHealthy), "b's series are gone")
	require.Empty(t, b.queried()[1:], "b is no longer asked")

	for _, bad := range []string{"", "ftp://relay.example", "https://user@relay.example", "https://relay.example/path", "https://relay.example?q=1", strings.Repeat("a", 600)} {
		require.ErrorIs(t, e.w.Observe(bad), relaywatch.ErrInvalidRelay, bad)
	}
}

// Hostnames are sent as relays key hosts; bad settings are refused.
func TestConfig(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{Hostname: "http://LocalHost:2583/"}, f)
	e.check(t, f)
	require.Equal(t, []string{"localhost:2583"}, f.queried())

	for _, h := range []string{"", "a b", "https://x/y", strings.Repeat("a", 300)} {
		_, err := relaywatch.New(relaywatch.Config{Hostname: h})
		require.ErrorIs(t, err, relaywatch.ErrInvalidHostname, h)
	}
	_, err := relaywatch.New(relaywatch.Config{Hostname: "pds.example.com", Relays: []string{"gopher://x"}})
	require.ErrorIs(t, err, relaywatch.ErrInvalidRelay)

	// The zero value of everything else works: no head, no registry.
	w, err := relaywatch.New(relaywatch.Config{Hostname: "pds.example.com", Relays: []string{f.URL}})
	require.NoError(t, err)
	f.set("active", 3)
	reports := w.CheckNow(context.Background())
	require.Equal(t, relaywatch.StateHealthy, reports[0].State)
	require.Equal(t, int64(3), *reports[0].Seq)
}

// A check cut short by shutdown judges nothing.
func TestCanceledCheckJudgesNothing(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{}, f)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	reports := e.w.CheckNow(ctx)
	require.Equal(t, relaywatch.StatePending, reports[0].State)
	require.Empty(t, e.logs.at(slog.LevelWarn, ""))
}

// Run checks at once and then on every tick, until its context ends.
func TestRun(t *testing.T) {
	f := newFakeRelay(t)
	f.requests = make(chan struct{})
	e := newEnv(t, relaywatch.Config{Interval: time.Millisecond}, f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.w.Run(ctx) }()
	<-f.requests
	<-f.requests
	cancel()
	require.NoError(t, <-done)
	require.GreaterOrEqual(t, metric(t, e.reg, "bulwark_relay_checks_total", map[string]string{"relay": f.name(), "result": "ok"}), 1.0)
}

// With the default settings a relay that stops is stuck on the second
// check after our head passed it: within two intervals.
func TestStuckWithinTwoIntervalsByDefault(t *testing.T) {
	f := newFakeRelay(t)
	e := newEnv(t, relaywatch.Config{}, f)
	e.events.byseq[101] = relaywatch.EventInfo{Seq: 101, Kind: "commit", DID: "did:plc:big", Size: 6_000_000, BrokenLimit: oversize}
	e.head.set(100, e.clock.Now())
	f.set("active", 100)
	require.Equal(t, relaywatch.StateHealthy, e.check(t, f).State)

	// The relay stops at 100; our head moves on.
	e.clock.Advance(time.Minute)
	e.head.set(105, e.clock.Now())
	r := e.check(t, f)
	require.Equal(t, relaywatch.StateHealthy, r.State)
	require.Equal(t, 1, r.SameSeqChecks)
	e.clock.Advance(time.Minute)
	e.head.set(110, e.clock.Now())
	r = e.check(t, f)
	require.Equal(t, relaywatch.StateStuck, r.State, "the second check at the same seq")
	require.Equal(t, int64(101), r.Event.Seq)
	require.Len(t, e.alerts.all(), 1)
}

// A healthy relay reports the position it last saved, and indigo's saves
// it every 4 s: checked every 2 s, it reports the same seq on two or three
// checks in a row while newer events exist, then jumps. It is never
// flagged, whatever the number of checks; a relay that really stops is,
// once its oldest unread event has waited StuckFor.
func TestSteppedRelayIsNotStuck(t *testing.T) {
	for _, checks := range []int{0, 2, 3} {
		t.Run(fmt.Sprintf("stuck checks %d", checks), func(t *testing.T) {
			f := newFakeRelay(t)
			e := newEnv(t, relaywatch.Config{Interval: 2 * time.Second, StuckChecks: checks}, f)
			for s := int64(1000); s < 3000; s++ {
				e.events.byseq[s] = relaywatch.EventInfo{Seq: s, Kind: "commit", DID: "did:plc:busy", Size: 900}
			}
			start := e.clock.Now()
			// Two events a second. The relay reads each within 300 ms and
			// saves its position every 4.1 s.
			headAt := func(d time.Duration) int64 { return 1000 + int64(2*max(d, 0)/time.Second) }
			const save = 4100 * time.Millisecond
			for range 300 {
				d := e.clock.Now().Sub(start)
				e.head.set(headAt(d), e.clock.Now())
				f.set("active", headAt(d/save*save-300*time.Millisecond))
				r := e.check(t, f)
				require.NotEqual(t, relaywatch.StateStuck, r.State, "at %s: relay %d, head %d", d, *r.Seq, *r.Head)
				e.clock.Advance(2 * time.Second)
			}
			require.Empty(t, e.logs.at(slog.LevelWarn, ""))
			require.Empty(t, e.alerts.all())

			// The relay stops; our head goes on.
			stopped := headAt(e.clock.Now().Sub(start) - 300*time.Millisecond)
			f.set("active", stopped)
			n := 0
			for ; n < 30; n++ {
				e.head.set(headAt(e.clock.Now().Sub(start)), e.clock.Now())
				if e.check(t, f).State == relaywatch.StateStuck {
					break
				}
				e.clock.Advance(2 * time.Second)
			}
			require.Less(t, n, 30, "a relay that stopped is flagged")
			require.GreaterOrEqual(t, time.Duration(n)*2*time.Second, 28*time.Second, "not before its oldest unread event waited the default 30 s")
			require.Len(t, e.alerts.all(), 1)
			require.Equal(t, stopped+1, e.alerts.all()[0].Report.Event.Seq)
		})
	}
}
