package firehose_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/events"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
)

// loopingConsumer consumes like indigo's relay: a frame over its read
// limit drops the connection, and it redials at once with the same
// cursor; a frame it reads moves its cursor.
type loopingConsumer struct {
	cursor atomic.Int64
	dials  atomic.Int64
	syncs  atomic.Int64
}

// run loops until ctx ends, as client ip (X-Forwarded-For) with agent ua.
func (l *loopingConsumer) run(ctx context.Context, wsURL, ip, ua string, readLimit int64) {
	h := http.Header{"X-Forwarded-For": {ip}, "User-Agent": {ua}}
	for ctx.Err() == nil {
		l.dials.Add(1)
		conn, resp, err := websocket.DefaultDialer.DialContext(ctx, fmt.Sprintf("%s?cursor=%d", wsURL, l.cursor.Load()), h)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond): // a client's pause before its next dial
			}
			continue
		}
		resp.Body.Close()
		conn.SetReadLimit(readLimit)
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		for {
			_, msg, err := conn.ReadMessage()
			if err != nil {
				break
			}
			if seq := l.seqOf(msg); seq > l.cursor.Load() {
				l.cursor.Store(seq)
			}
		}
		stop()
		_ = conn.Close()
	}
}

// seqOf is the seq of a #commit or #sync frame (0 for others).
func (l *loopingConsumer) seqOf(msg []byte) int64 {
	r := bytes.NewReader(msg)
	var hdr events.EventHeader
	if hdr.UnmarshalCBOR(r) != nil || hdr.Op != 1 {
		return 0
	}
	switch hdr.MsgType {
	case "#commit":
		var c comatproto.SyncSubscribeRepos_Commit
		if c.UnmarshalCBOR(r) == nil {
			return c.Seq
		}
	case "#sync":
		var s comatproto.SyncSubscribeRepos_Sync
		if s.UnmarshalCBOR(r) == nil {
			l.syncs.Add(1)
			return s.Seq
		}
	}
	return 0
}

func startLooping(t *testing.T, wsURL, ip, ua string, cursor, readLimit int64) *loopingConsumer {
	t.Helper()
	l := &loopingConsumer{}
	l.cursor.Store(cursor)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.run(ctx, wsURL, ip, ua, readLimit) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return l
}

// countingInspect is a HealthConfig.Inspect over log that counts its calls.
type countingInspect struct {
	log   atomic.Pointer[eventlog.Log]
	calls atomic.Int64
}

func (c *countingInspect) inspect(ctx context.Context, seq int64) (*eventlog.EventInfo, error) {
	c.calls.Add(1)
	evs, err := c.log.Load().Inspect(ctx, eventlog.EventFilter{FromSeq: seq, Limit: 1})
	if err != nil || len(evs) == 0 {
		return nil, err
	}
	return &evs[0], nil
}

// TestStuckConsumerHeldUntilRepair replays the redial loop: a commit over
// the consumer's read limit, the #sync fallback off, a consumer that
// drops the connection on it and redials at once. Once it is flagged
// stuck, its next connection is held after the upgrade (no database
// work, no new dial) until the event is repaired; the repair, noticed by
// re-reading the event, releases it and it reads the #sync at once. The
// log has one line for the failures, one for the stuck consumer, one for
// the repair and one, with the count, for the recovery.
func TestStuckConsumerHeldUntilRepair(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	ins := &countingInspect{}
	health := firehose.NewHealth(firehose.HealthConfig{
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Inspect: ins.inspect, RepairPoll: 20 * time.Millisecond,
	})
	b := setup(t, options{hub: firehose.Config{DisableOversizeSync: true, Health: health}})
	ins.log.Store(b.log)
	did := b.newRepo(t)
	b.write(t, did, "ok")
	b.waitSequenced(t, 2)
	storeOversized(t, b, b.allEvents(t)[1])
	b.write(t, did, "after")
	last := b.waitSequenced(t, 4)
	const badSeq = 3

	// Blocks over 2,000,000 bytes: a relay drops the commit; this one
	// drops the connection, the worst a relay does.
	l := startLooping(t, b.wsURL, "198.51.100.7", "looping-relay/1", badSeq-1, 2_000_000)
	var stuck *firehose.StuckInfo
	require.Eventually(t, func() bool {
		r := consumerAt(health, "198.51.100.7")
		stuck = r.Stuck
		return stuck != nil && stuck.Held == 1
	}, 30*time.Second, 5*time.Millisecond, "the stuck consumer's reconnection is held")
	require.Equal(t, int64(badSeq), stuck.Seq)
	require.Contains(t, stuck.Command, fmt.Sprintf("rewrite-as-sync --seq %d", badSeq))
	dials, m := l.dials.Load(), b.queries.mark()
	// While it is held the consumer does not redial and its connection
	// reads nothing, through several repair checks.
	calls := ins.calls.Load()
	require.Eventually(t, func() bool { return ins.calls.Load() >= calls+5 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, dials, l.dials.Load(), "no redial while held")
	require.Empty(t, b.queries.subscriptionsSince(m), "a held connection does no database work")
	require.Less(t, l.cursor.Load(), int64(badSeq))
	failures := consumerAt(health, "198.51.100.7").Failing.Failures
	require.GreaterOrEqual(t, failures, int64(3))
	require.Equal(t, 1, strings.Count(logs.String(), "connection failed"), "one warning for the run of failures")
	require.Equal(t, 1, strings.Count(logs.String(), "consumer is stuck"))

	_, err := b.log.RewriteAsSync(context.Background(), badSeq, "admin", "test")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return l.cursor.Load() >= last }, 30*time.Second, 5*time.Millisecond, "released, it reads the #sync and what follows")
	require.Equal(t, dials, l.dials.Load(), "the held connection itself was served")
	require.EqualValues(t, 1, l.syncs.Load())
	require.Contains(t, logs.String(), "firehose event repaired")
	// The run of failures ends once the connection has been read a while:
	// one line with the count.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "msg=\"firehose consumer recovered\"") }, 30*time.Second, 10*time.Millisecond)
	require.Contains(t, logLine(logs.String(), "consumer recovered"), fmt.Sprintf("failures=%d", failures))
	require.Equal(t, 1, strings.Count(logs.String(), "connection failed"))
	require.Nil(t, consumerAt(health, "198.51.100.7").Failing)
}

// TestFutureCursorWarnedOnce: a consumer asking for a cursor beyond our
// newest event (our sequence went back: a restored backup) is refused
// with FutureCursor each time, and warned of once, with the raise-seq
// command that lets it in; after that command its cursor is served.
func TestFutureCursorWarnedOnce(t *testing.T) {
	t.Parallel()
	logs := &syncbuf.Buffer{}
	health := firehose.NewHealth(firehose.HealthConfig{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	b := setup(t, options{hub: firehose.Config{Health: health}})
	did := b.newRepo(t)
	b.write(t, did, "before the restore")
	last := b.waitSequenced(t, 2)

	cursor := last + 40 // where the consumer had read up to before the restore
	h := http.Header{"X-Forwarded-For": {"198.51.100.20"}, "User-Agent": {"appview/1"}}
	for range 5 {
		conn, resp, err := websocket.DefaultDialer.Dial(fmt.Sprintf("%s?cursor=%d", b.wsURL, cursor), h)
		require.NoError(t, err)
		resp.Body.Close()
		f, err := readFrame(t, conn)
		require.NoError(t, err)
		require.Equal(t, firehose.ErrNameFutureCursor, f.err.Error)
		conn.Close()
	}
	require.Eventually(t, func() bool {
		f := consumerAt(health, "198.51.100.20").FutureCursor
		return f != nil && f.Refusals == 5
	}, 10*time.Second, time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), "cursor beyond our newest event"), "warned once")
	warning := logLine(logs.String(), "cursor beyond our newest event")
	for _, want := range []string{"level=WARN", "ip=198.51.100.20", "user_agent=appview/1", fmt.Sprintf("cursor=%d", cursor), fmt.Sprintf("head=%d", last),
		fmt.Sprintf("bulwark admin firehose raise-seq --floor %d ", cursor)} {
		require.Contains(t, warning, want)
	}
	f := consumerAt(health, "198.51.100.20").FutureCursor
	require.Equal(t, cursor, f.Cursor)

	_, _, err := b.log.RaiseSeqAudited(context.Background(), cursor, "admin", "restored")
	require.NoError(t, err)
	b.write(t, did, "after the raise")
	b.waitSequenced(t, cursor+1)
	conn, resp, err := websocket.DefaultDialer.Dial(fmt.Sprintf("%s?cursor=%d", b.wsURL, cursor), h)
	require.NoError(t, err)
	resp.Body.Close()
	got, err := readFrame(t, conn)
	require.NoError(t, err)
	require.Greater(t, got.seq, cursor)
	conn.Close()
	require.Eventually(t, func() bool { return consumerAt(health, "198.51.100.20").FutureCursor == nil }, 10*time.Second, time.Millisecond)
	require.Contains(t, logLine(logs.String(), "within our sequence again"), "refusals=5")
}

func consumerAt(h *firehose.Health, ip string) firehose.ConsumerReport {
	for _, r := range h.Consumers() {
		if r.IP == ip {
			return r
		}
	}
	return firehose.ConsumerReport{}
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
