package firehose

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
)

func TestHealthFlagsStuckConsumerOnce(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	stuck := make(chan ConsumerReport, 10)
	h := NewHealth(HealthConfig{
		StuckAfter: 3,
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
		// The log ends at seq 50.
		Inspect: func(_ context.Context, seq int64) (*eventlog.EventInfo, error) {
			if seq > 50 {
				return nil, nil
			}
			return &eventlog.EventInfo{Seq: seq + 3, Kind: eventlog.KindCommit, FrameBytes: 6_000_000, Problems: []string{"too big"}}, nil
		},
		OnStuck: func(r ConsumerReport) { stuck <- r },
	})
	cursor := int64(41)
	connect := func(ip string, cur *int64, frames int) {
		c := h.Start(ip, "relay/1", cur)
		for i := range frames {
			c.Sent(cursor + 1 + int64(i))
		}
		c.End(EndReadError)
	}
	// A healthy relay advancing its cursor is never stuck.
	for i := range 10 {
		c := int64(i * 10)
		connect("10.0.0.2", &c, 5)
	}
	// Live-only and head-of-stream reconnects are not stuck either.
	head := int64(50)
	for range 5 {
		connect("10.0.0.3", nil, 3)
		connect("10.0.0.4", &head, 0)
	}
	// The stuck relay: same cursor, a frame sent, dropped, again and again.
	for range 2 {
		connect("10.0.0.1", &cursor, 1)
	}
	require.Nil(t, findConsumer(h, "10.0.0.1").Stuck, "two reconnects are not yet an incident")
	for range 5 {
		connect("10.0.0.1", &cursor, 1)
	}
	nextStuck(t, stuck)
	// A consumer at the head is flagged until its own check (no
	// announcement) finds nothing after its cursor.
	require.Eventually(t, func() bool { return h.StuckCount() == 1 }, 10*time.Second, time.Millisecond)
	r := findConsumer(h, "10.0.0.1")
	require.NotNil(t, r.Stuck)
	require.Equal(t, cursor, r.Stuck.Cursor)
	require.Equal(t, cursor+4, r.Stuck.Seq, "the event after the cursor, as the log reports it")
	require.Equal(t, 7, r.Stuck.Reconnects)
	require.Equal(t, 1, h.StuckCount())
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte("consumer is stuck")), "one warning per incident")
	for _, ip := range []string{"10.0.0.2", "10.0.0.3", "10.0.0.4"} {
		require.Nil(t, findConsumer(h, ip).Stuck, ip)
	}
	require.Equal(t, "10.0.0.1", h.Consumers()[0].IP, "stuck consumers are listed first")

	// Once repaired the relay moves on: the incident ends.
	next := cursor + 4
	connect("10.0.0.1", &next, 3)
	require.Nil(t, findConsumer(h, "10.0.0.1").Stuck)
	require.Equal(t, 0, h.StuckCount())
}

// TestHealthStuckBehindLaggingCursor: indigo's relay asks for the seq
// before the last one it finished, so each connection is sent a sound event
// and then the bad one. The flag must name the bad one, not the event after
// the cursor.
func TestHealthStuckBehindLaggingCursor(t *testing.T) {
	t.Parallel()
	const bad = 43
	stuck := make(chan ConsumerReport, 10)
	h := NewHealth(HealthConfig{
		StuckAfter: 3,
		Logger:     slog.New(slog.DiscardHandler),
		Inspect: func(_ context.Context, seq int64) (*eventlog.EventInfo, error) {
			if seq > 60 {
				return nil, nil
			}
			ev := &eventlog.EventInfo{Seq: seq, Kind: eventlog.KindCommit, FrameBytes: 2_000}
			if seq == bad {
				ev.FrameBytes, ev.Problems = 5_100_000, []string{"frame over 5,000,000 bytes"}
			}
			return ev, nil
		},
		OnStuck: func(r ConsumerReport) { stuck <- r },
	})
	cursor := int64(bad - 2)
	for range 4 {
		c := h.Start("10.0.0.9", "indigo-relay", &cursor)
		c.Sent(bad - 1)
		c.Sent(bad) // written; the relay drops the connection on reading it
		c.End(EndReadError)
	}
	nextStuck(t, stuck)
	r := findConsumer(h, "10.0.0.9")
	require.Equal(t, cursor, r.Stuck.Cursor)
	require.Equal(t, int64(bad), r.Stuck.LastSent)
	require.Equal(t, int64(bad), r.Stuck.Seq, "the event over the limit, not the sound one after the cursor")
	require.NotEmpty(t, r.Stuck.Event.Problems)

	// A consumer that chokes on a sound event (say it rejects it) is
	// flagged at the last event it was sent.
	other := int64(20)
	for range 4 {
		c := h.Start("10.0.0.10", "picky/1", &other)
		c.Sent(21)
		c.Sent(22)
		c.End(EndReadError)
	}
	nextStuck(t, stuck)
	require.Empty(t, stuck, "one announcement per incident")
	require.Equal(t, int64(22), findConsumer(h, "10.0.0.10").Stuck.Seq)
}

func TestHealthBoundedMemory(t *testing.T) {
	t.Parallel()
	h := NewHealth(HealthConfig{MaxConsumers: 100, History: 4})
	for i := range 10_000 {
		h.Start(fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), "x", nil).End(EndClientClosed)
		h.Refused(fmt.Sprintf("192.0.%d.%d", i>>8&255, i&255))
	}
	require.LessOrEqual(t, len(h.Consumers()), 100)
	for range 50 {
		h.Start("10.9.9.9", "x", nil).End(EndClientClosed)
	}
	r := findConsumer(h, "10.9.9.9")
	require.Len(t, r.Recent, 4)
	require.Equal(t, int64(50), r.Connections)
}

// TestHealthBoundsWhatClientsSend: a User-Agent is kept to MaxUserAgent
// bytes; refusals are counted per address, on the consumer last seen from
// it, whatever else the refused requests carried; and the table stays
// within MaxBytes however large the consumers' strings are.
func TestHealthBoundsWhatClientsSend(t *testing.T) {
	t.Parallel()
	h := NewHealth(HealthConfig{History: 4, MaxBytes: 64 << 10})
	huge := strings.Repeat("é", 30_000) // 60 KB, two bytes a rune
	// An odd prefix puts the cut inside a rune, which is dropped.
	h.Start("192.0.2.7", "relay/1.0"+huge, nil).End(EndClientClosed)
	r := findConsumer(h, "192.0.2.7")
	require.Len(t, r.UserAgent, MaxUserAgent-1)
	require.True(t, utf8.ValidString(r.UserAgent))

	for range 1000 {
		h.Refused("192.0.2.7")
		h.Refused("192.0.2.8")
	}
	require.Len(t, h.Consumers(), 2, "refusals add at most one entry per address")
	require.EqualValues(t, 1000, findConsumer(h, "192.0.2.7").Refused)
	require.EqualValues(t, 1000, findConsumer(h, "192.0.2.8").Refused)
	require.Empty(t, findConsumer(h, "192.0.2.8").UserAgent)

	for i := range 5000 {
		c := h.Start(fmt.Sprintf("10.0.%d.%d", i>>8&255, i&255), fmt.Sprint(i, huge), nil)
		c.End(EndClientClosed)
	}
	require.LessOrEqual(t, h.Bytes(), int64(64<<10))
	var strs int
	for _, c := range h.Consumers() {
		strs += len(c.IP) + len(c.UserAgent)
	}
	require.Less(t, strs, 64<<10)
	require.NotEmpty(t, h.Consumers())
}

func findConsumer(h *Health, ip string) ConsumerReport {
	for _, r := range h.Consumers() {
		if r.IP == ip {
			return r
		}
	}
	return ConsumerReport{}
}

// nextStuck waits for the next stuck announcement (it runs in a goroutine
// of its own, after the tracker's state is updated); the deadline only
// bounds a failing test.
func nextStuck(t *testing.T, stuck chan ConsumerReport) ConsumerReport {
	t.Helper()
	select {
	case r := <-stuck:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no consumer was announced stuck")
		return ConsumerReport{}
	}
}

// Incident warnings are one per consumer, and consumers are what clients
// say they are (address and User-Agent): a client inventing agents gets
// at most warnBurst warnings logged; every consumer is still tracked.
func TestHealthBoundsIncidentWarnings(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	h := NewHealth(HealthConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	cursor := int64(1_000_000)
	for i := range 100 {
		c := h.Start("192.0.2.50", fmt.Sprint("agent/", i), &cursor)
		c.FutureCursor(10)
		c.End(EndFutureCursor)
		f := h.Start("192.0.2.51", fmt.Sprint("agent/", i), nil)
		f.End(EndWriteError)
	}
	require.Equal(t, warnBurst, strings.Count(logs.String(), "level=WARN"))
	ahead, failing := 0, 0
	for _, r := range h.Consumers() {
		if r.FutureCursor != nil {
			ahead++
		}
		if r.Failing != nil {
			failing++
		}
	}
	require.Equal(t, 100, ahead)
	require.Equal(t, 100, failing)
	require.Contains(t, logs.String(), "ahead_by=999990")
}

// A consumer that keeps refusing frames at a cursor has its next
// connections held while the event after the cursor breaks a limit; if the
// event was repaired before it was looked at (no limit broken any more),
// none is held: no repair is coming to release it.
func TestHealthHoldsOnlyWhileARepairCanRelease(t *testing.T) {
	t.Parallel()
	for _, repaired := range []bool{false, true} {
		stuck := make(chan ConsumerReport, 1)
		h := NewHealth(HealthConfig{
			Logger: slog.New(slog.DiscardHandler),
			Inspect: func(_ context.Context, seq int64) (*eventlog.EventInfo, error) {
				if seq > 8 {
					return nil, nil
				}
				ev := &eventlog.EventInfo{Seq: 8, Kind: eventlog.KindCommit, FrameBytes: 5_100_000, Problems: []string{"frame over 5,000,000 bytes"}}
				if repaired {
					ev.Kind, ev.FrameBytes, ev.Problems = eventlog.KindSync, 400, nil
				}
				return ev, nil
			},
			OnStuck: func(r ConsumerReport) { stuck <- r },
		})
		cursor := int64(7)
		for range 3 {
			h.Start("10.0.0.8", "relay/2", &cursor).End(EndRefusedFrame)
		}
		nextStuck(t, stuck)
		release, limit := h.Start("10.0.0.8", "relay/2", &cursor).Hold(context.Background())
		if repaired {
			require.Nil(t, release, "nothing to wait for")
			continue
		}
		require.NotNil(t, release)
		require.Equal(t, 10*time.Minute, limit, "an event over a limit: until it is repaired")
	}
}
