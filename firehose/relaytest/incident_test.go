package relaytest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	relaytesting "github.com/bluesky-social/indigo/cmd/relay/testing"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/repo"
)

// TestIndigoRelayIncident replays the incident with indigo's relay
// following Bulwark (strict mode), the #sync fallback off: a #commit is
// stored over the relay's frame limit, the relay's connection fails on it,
// and it redials at once, forever. Twice: admitted as any client (1 a
// minute, burst 5), and allow-listed as a known relay (no rate).
//
//   - Bulwark logs the incident in a few lines, not one per redial: one
//     warning when the relay's connections start failing, one naming the
//     stuck relay, the event and the repair command.
//   - After it is flagged, the relay's next connection is held without
//     database work: it stops redialing. Its dials are never refused, so
//     its redial back-off (which grows only on failed dials) stays at zero.
//   - The operator repairs the event with the admin XRPC method: the held
//     connection is served at once and the relay ingests the #sync and the
//     commit after it, then one line counts the failures.
//
// Not parallel: the relay logs through slog.Default, which the test swaps
// for a recorder while it runs.
func TestIndigoRelayIncident(t *testing.T) {
	if testing.Short() {
		t.Skip("runs indigo's relay against Bulwark until it is stuck and repaired")
	}
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, tc := range []struct {
		name      string
		admission firehose.AdmissionConfig
	}{
		{"any client", firehose.AdmissionConfig{}},
		{"known relay", firehose.AdmissionConfig{Allow: loopback}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			relayLogs := recordDefaultLog(t)
			serverLogs := &syncbuf.Buffer{}
			ctx := context.Background()
			e := startRepairEnvWith(t, ctx, repairOptions{
				disableFallback: true, admission: &tc.admission, logger: slog.New(slog.NewTextHandler(serverLogs, nil)),
			})
			out, bad, later, badSeq, mark := followThenOversize(t, e, serverLogs)
			t.Cleanup(func() {
				if t.Failed() {
					for _, c := range e.hub.Health().Consumers() {
						t.Logf("consumer %+v, stuck %+v, failing %+v", c, c.Stuck, c.Failing)
					}
					t.Logf("bad seq %d; Bulwark's log:\n%s\nthe relay's:\n%s", badSeq, serverLogs.String()[mark:], relayLogs.String())
				}
			})
			stuck := eventually(t, func() (firehose.ConsumerReport, bool) {
				for _, c := range e.hub.Health().Consumers() {
					// Its connection held: stuck, and one connection open.
					if c.Stuck != nil && c.Stuck.Event != nil && c.Stuck.Seq == badSeq && c.Active == 1 {
						return c, true
					}
				}
				return firehose.ConsumerReport{}, false
			})
			require.Contains(t, stuck.UserAgent, "indigo-relay")
			require.NotEmpty(t, stuck.Stuck.Event.Problems)
			require.Zero(t, stuck.Refused, "never refused")
			require.LessOrEqual(t, stuck.Connections, int64(10), "a few connections, then one held")
			require.Zero(t, relayLogs.count(`msg="dialing failed"`), "no dial of the relay failed: its back-off stays at zero")
			require.GreaterOrEqual(t, relayLogs.count(`msg="host connection failed"`, "read limit exceeded"), 3)

			// The repair, as `bulwark admin firehose rewrite-as-sync` makes it.
			repaired := time.Now()
			req, err := http.NewRequest(http.MethodPost, e.url+"/xrpc/"+pds.AdminNSIDPrefix+"rewriteEventAsSync",
				strings.NewReader(fmt.Sprintf(`{"seq":%d,"reason":"relay stuck"}`, badSeq)))
			require.NoError(t, err)
			req.SetBasicAuth("admin", e.password)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Eventually(t, func() bool { return out.has("#commit " + later.Rev) }, 30*time.Second, 5*time.Millisecond, "the relay resumes")
			t.Logf("%s: the relay passed the event %s after the repair", tc.name, time.Since(repaired).Round(time.Millisecond))
			require.True(t, out.has("#sync "+bad.Rev))
			require.Zero(t, relayLogs.count(`msg="dialing failed"`))
			after := findConsumer(e.hub.Health(), stuck.IP, stuck.UserAgent)
			require.Equal(t, stuck.Connections, after.Connections, "the held connection itself was served")

			requireIncidentLogs(t, serverLogs, mark, badSeq)
		})
	}
}

// requireIncidentLogs: from mark on, the server logged the incident in a
// few lines: two warnings (the failures, the stuck relay with the repair
// command), the repair, and once the relay reads again, one line counting
// the failures.
func requireIncidentLogs(t *testing.T, serverLogs *syncbuf.Buffer, mark int, badSeq int64) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(serverLogs.String()[mark:], `msg="firehose consumer recovered"`) }, 30*time.Second, 20*time.Millisecond)
	logs := serverLogs.String()[mark:]
	var warns []string
	for line := range strings.Lines(logs) {
		// (The repair itself is logged as a warning too.)
		if strings.Contains(line, "level=WARN") && !strings.Contains(line, `msg="firehose repair"`) {
			warns = append(warns, line)
		}
	}
	require.Len(t, warns, 2, "the failures and the stuck relay, once each: %q", warns)
	require.Contains(t, warns[0], "connection failed")
	require.Contains(t, warns[1], "consumer is stuck")
	require.Contains(t, warns[1], fmt.Sprintf("rewrite-as-sync --seq %d", badSeq))
	require.Contains(t, logLine(logs, "firehose event repaired"), fmt.Sprintf("seq=%d", badSeq))
	recovered := logLine(logs, `msg="firehose consumer recovered"`)
	require.Contains(t, recovered, fmt.Sprintf("was_stuck_at=%d", badSeq))
	require.Contains(t, recovered, "failures=")
	require.LessOrEqual(t, bytes.Count([]byte(logs), []byte("\n")), 20, "a few lines in all: %s", logs)
}

// followThenOversize has indigo's relay follow e live; then, while its
// connection is down, the account commits twice and the first of these
// commits is stored over the relay's frame limit; the relay comes back at
// its cursor. It returns the relay's output, the two commits, the bad
// one's seq, and where serverLogs stood before.
func followThenOversize(t *testing.T, e *repairEnv, serverLogs *syncbuf.Buffer) (out *relayOutput, bad, later *repo.CommitResult, badSeq int64, mark int) {
	t.Helper()
	ctx := context.Background()
	relay := relaytesting.MustSimpleRelay(e.dir, t.TempDir(), false)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, e.host, true, true))
	t.Cleanup(func() { _ = relay.Relay.Slurper.KillUpstreamConnection(context.Background(), e.host, false) })
	require.Eventually(t, func() bool { return e.hub.Live() == 1 }, 30*time.Second, 5*time.Millisecond)
	out = watchRelay(t, ctx, relay.Port)
	e.createAccount(t)
	before := e.post(t, ctx, "post 0").Rev
	require.Eventually(t, func() bool { return out.has("#commit " + before) }, 30*time.Second, 10*time.Millisecond)
	// As in TestIndigoRelayResumesAfterRewriteAsSync: the relay's cursor
	// flushed, then its flusher stopped (the subscription goes on).
	beforeSeq := e.seqOf(t, ctx, before)
	require.Eventually(t, func() bool {
		h, err := relay.Relay.GetHost(ctx, e.host)
		return err == nil && h.LastSeq == beforeSeq
	}, 30*time.Second, 20*time.Millisecond, "the relay flushes its cursor")
	require.NoError(t, relay.Relay.Slurper.Shutdown())
	require.NoError(t, relay.Relay.Slurper.KillUpstreamConnection(ctx, e.host, false))
	require.Eventually(t, func() bool { return !relay.Relay.Slurper.CheckIfSubscribed(e.host) && e.hub.Subscribers() == 0 },
		30*time.Second, 5*time.Millisecond, "the relay's connection is down")

	bad, later = e.post(t, ctx, "post 1"), e.post(t, ctx, "post 2")
	require.Eventually(t, func() bool {
		var n int
		err := e.pool.QueryRow(ctx, "SELECT count(*) FROM events WHERE did = $1 AND rev IN ($2, $3) AND seq IS NOT NULL", e.did.String(), bad.Rev, later.Rev).Scan(&n)
		return err == nil && n == 2
	}, 30*time.Second, 5*time.Millisecond)
	badSeq = e.seqOf(t, ctx, bad.Rev)
	inflate(t, e.pool, "seq = $1", badSeq, 5_100_000)
	mark = len(serverLogs.String())
	// (SubscribeToHost dials with the cursor the relay stored.)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, e.host, true, true))
	return out, bad, later, badSeq, mark
}

// eventually polls f until it reports ok, and returns its value.
func eventually[T any](t *testing.T, f func() (T, bool)) T {
	t.Helper()
	var v T
	require.Eventually(t, func() bool {
		var ok bool
		v, ok = f()
		return ok
	}, 30*time.Second, 5*time.Millisecond)
	return v
}

// findConsumer is h's report of the consumer ip/ua.
func findConsumer(h *firehose.Health, ip, ua string) firehose.ConsumerReport {
	for _, c := range h.Consumers() {
		if c.IP == ip && c.UserAgent == ua {
			return c
		}
	}
	return firehose.ConsumerReport{}
}
