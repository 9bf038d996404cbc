package firehose

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// A stuck consumer: its last StuckAfter connections asked for the same
// cursor and it never got past the event after it. Serving that event again
// is futile when the connections failed (the client dropped the frame) and
// costs a read of the event each time, at the rate the consumer redials:
// indigo's relay redials at once after an established connection fails,
// over a hundred times a second. So once the event is known, the
// consumer's next connections at that cursor are held after the upgrade,
// before any database work, answering pings, until the event is repaired
// (Run notices it, in this process or another) or ParkFor passes. The
// consumer then waits connected instead of redialing, and resumes the
// moment the repair lands.

// stuckLocateTimeout bounds the event lookups of one announcement or one
// repair check.
const stuckLocateTimeout = 10 * time.Second

// checkStuck flags the consumer when its last StuckAfter ended connections,
// all within Window, asked for the same cursor and were sent something: a
// consumer that keeps coming back for the same place is not getting past
// the event there, whatever we wrote to its socket. It returns the report
// and whether the incident is new. h.mu held.
func (h *Health) checkStuck(c *consumer, logs []logLine) (ConsumerReport, bool, []logLine) {
	var ended []*Conn
	for i := len(c.recent) - 1; i >= 0 && len(ended) < h.cfg.StuckAfter; i-- {
		if !c.recent[i].ended.IsZero() {
			ended = append(ended, c.recent[i])
		}
	}
	if len(ended) == 0 {
		return ConsumerReport{}, false, logs
	}
	last := ended[0]
	if last.cursor == nil || (c.stuck != nil && *last.cursor != c.stuck.Cursor) {
		if c.stuck != nil {
			logs = h.recovered(c, "firehose consumer recovered: it got past the event it was stuck on", time.Now(), logs)
		}
		h.endStuck(c)
		return ConsumerReport{}, false, logs
	}
	if c.stuck != nil {
		c.stuck.Reconnects++
		return ConsumerReport{}, false, logs
	}
	if len(ended) < h.cfg.StuckAfter {
		return ConsumerReport{}, false, logs
	}
	cutoff := time.Now().Add(-h.cfg.Window)
	sent, failed := false, true
	var lastSent int64
	for _, e := range ended {
		if e.cursor == nil || *e.cursor != *last.cursor || e.started.Before(cutoff) {
			return ConsumerReport{}, false, logs
		}
		sent = sent || e.frames.Load() > 0
		failed = failed && e.reason.failed()
		lastSent = max(lastSent, e.lastSeq.Load())
	}
	// A consumer at the head that reconnects is not stuck: something must
	// follow its cursor. A frame written says so; otherwise (the write of an
	// oversized frame fails when the client drops it) Inspect decides, in
	// announce.
	if !sent && (h.cfg.Inspect == nil || (c.headCursor == *last.cursor && time.Since(c.headAt) < time.Minute)) {
		return ConsumerReport{}, false, logs
	}
	seq := *last.cursor + 1
	c.stuck = &StuckInfo{Cursor: *last.cursor, Seq: seq, LastSent: lastSent, Reconnects: len(ended), Since: ended[len(ended)-1].started, Command: repairCommand(seq)}
	c.release, c.holdable = make(chan struct{}), failed
	h.open[c] = struct{}{}
	return h.report(c), true, logs
}

// repairCommand is the admin command that lets consumers past seq.
func repairCommand(seq int64) string {
	return fmt.Sprintf("bulwark admin firehose rewrite-as-sync --seq %d --reason %q", seq, "consumers stuck on it")
}

// endStuck ends c's stuck incident, if any, releasing the connections
// held for it. h.mu held.
func (h *Health) endStuck(c *consumer) {
	h.stopHolding(c)
	if c.failing != nil && c.stuck != nil && c.stuck.Event != nil {
		c.failing.stuck = c.stuck
	}
	c.stuck = nil
	h.settle(c)
}

// Hold says whether the connection, just upgraded, should wait before it
// is served: its consumer is stuck at its cursor, and its connections
// failed there. (If the event turns out not to be there, the consumer is
// at the head, not stuck, and the wait ends.) It returns a channel closed when the
// incident ends (the event repaired, or the consumer no longer stuck) and
// how long to wait at most; nil when the connection is served at once.
// Call Unhold when the wait is over.
//
// A consumer redials as soon as it sees its connection fail, which can be
// before this end of that connection has ended: a connection at the
// cursor of an earlier one still open first waits (up to
// precursorWait, or until ctx ends) for that one to end, so that its
// failure counts.
func (c *Conn) Hold(ctx context.Context) (<-chan struct{}, time.Duration) {
	if prev := c.precursor(); prev != nil {
		t := time.NewTimer(precursorWait)
		select {
		case <-prev:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	h := c.h
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := c.c
	s := cs.stuck
	if s == nil || !cs.holdable || c.cursor == nil || *c.cursor != s.Cursor || !c.ended.IsZero() {
		return nil, 0
	}
	limit := h.cfg.ParkFor
	if s.Event != nil && len(s.Event.Problems) > 0 {
		// Nothing gets past an event over a protocol limit but a repair.
		limit *= 10
	}
	c.hold, c.holdFor = true, s
	s.Held++
	return cs.release, limit
}

// precursorWait bounds how long a connection waits for an earlier one of
// its consumer at the same cursor to end (see Hold).
const precursorWait = time.Second

// precursor returns the done channel of the consumer's latest earlier
// connection at the same cursor that is still being served, if any.
func (c *Conn) precursor() <-chan struct{} {
	if c.cursor == nil {
		return nil
	}
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	var done <-chan struct{}
	for _, o := range c.c.recent {
		if o != c && o.ended.IsZero() && !o.hold && o.cursor != nil && *o.cursor == *c.cursor && o.started.Before(c.started) {
			done = o.done
		}
	}
	return done
}

// Unhold records that the connection is no longer held.
func (c *Conn) Unhold() {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	c.unhold()
}

// unhold clears the connection's hold. h.mu held.
func (c *Conn) unhold() {
	if !c.hold {
		return
	}
	c.hold, c.serving = false, time.Now()
	if s := c.c.stuck; s != nil && s == c.holdFor {
		s.Held--
	}
	c.holdFor = nil
}

// announce fills in the event and warns, once per incident.
func (h *Health) announce(r ConsumerReport) {
	if h.cfg.Inspect != nil {
		ctx, cancel := context.WithTimeout(context.Background(), stuckLocateTimeout)
		defer cancel()
		ev, err := h.locate(ctx, r.Stuck)
		if err == nil && ev == nil {
			// Nothing follows the cursor: at the head, not stuck.
			h.mu.Lock()
			if c := h.lookupStuck(r); c != nil {
				h.endStuck(c)
				c.headCursor, c.headAt = r.Stuck.Cursor, time.Now()
			}
			h.mu.Unlock()
			return
		}
		if err == nil {
			h.mu.Lock()
			if c := h.lookupStuck(r); c != nil {
				c.stuck.Seq, c.stuck.Event, c.stuck.Command = ev.Seq, ev, repairCommand(ev.Seq)
				if len(ev.Problems) == 0 && c.refusedFrame() {
					// It refused a frame over its read limit, yet nothing
					// after its cursor breaks a limit now: the event was
					// repaired before it was looked at (or the consumer reads
					// less than the protocol allows). A repair to notice is
					// not coming: its connections are not held.
					h.stopHolding(c)
				}
			}
			h.mu.Unlock()
			r.Stuck.Seq, r.Stuck.Event, r.Stuck.Command = ev.Seq, ev, repairCommand(ev.Seq)
		}
	}
	attrs := []any{"ip", r.IP, "user_agent", r.UserAgent, "cursor", r.Stuck.Cursor, "seq", r.Stuck.Seq, "reconnects", r.Stuck.Reconnects}
	if ev := r.Stuck.Event; ev != nil {
		attrs = append(attrs, "kind", ev.Kind, "did", ev.DID, "frame_bytes", ev.FrameBytes, "blocks_bytes", ev.BlocksBytes, "ops", ev.Ops)
		if len(ev.Problems) > 0 {
			attrs = append(attrs, "breaks_limits", ev.Problems)
		}
	}
	attrs = append(attrs, "command", r.Stuck.Command)
	h.log.Warn("firehose consumer is stuck: it keeps reconnecting at the same cursor and never gets past the next event; "+
		"its reconnections wait, without database work, until the event is repaired with the command given", attrs...)
	if h.cfg.OnStuck != nil {
		h.cfg.OnStuck(r)
	}
}

// refusedFrame says whether one of c's connections at its stuck cursor
// ended with the client refusing a frame (close 1009). h.mu held.
func (c *consumer) refusedFrame() bool {
	for _, conn := range c.recent {
		if conn.reason == EndRefusedFrame && conn.cursor != nil && c.stuck != nil && *conn.cursor == c.stuck.Cursor {
			return true
		}
	}
	return false
}

// stopHolding releases c's held connections and holds no more for this
// incident. h.mu held.
func (h *Health) stopHolding(c *consumer) {
	if c.release != nil {
		close(c.release)
	}
	c.release, c.holdable = nil, false
}

// lookupStuck finds the consumer of r if it is still stuck at r's cursor.
// h.mu held.
func (h *Health) lookupStuck(r ConsumerReport) *consumer {
	el, ok := h.consumers[consumerKey{r.IP, r.UserAgent}]
	if !ok {
		return nil
	}
	c := el.Value.(*consumer)
	if c.stuck == nil || c.stuck.Cursor != r.Stuck.Cursor {
		return nil
	}
	return c
}

// locateWindow bounds how many events locate inspects.
const locateWindow = 16

// locate finds the event a stuck consumer cannot get past (see StuckInfo),
// or nil when nothing follows its cursor.
func (h *Health) locate(ctx context.Context, s *StuckInfo) (*eventlog.EventInfo, error) {
	var first, lastSent *eventlog.EventInfo
	seq := s.Cursor + 1
	for range locateWindow {
		ev, err := h.cfg.Inspect(ctx, seq)
		if err != nil {
			return nil, err
		}
		if ev == nil {
			break
		}
		if len(ev.Problems) > 0 {
			return ev, nil
		}
		if first == nil {
			first = ev
		}
		if ev.Seq <= s.LastSent {
			lastSent = ev
		}
		if ev.Seq > s.LastSent {
			break // one past what it was sent
		}
		seq = ev.Seq + 1
	}
	if lastSent != nil {
		return lastSent, nil
	}
	return first, nil
}

// checkRepairs reads again each event a consumer is stuck on; one that
// changed (rewritten, invalidated, pruned) was repaired, and the consumers
// stuck on it are let through.
func (h *Health) checkRepairs(ctx context.Context) {
	if h.cfg.Inspect == nil {
		return
	}
	h.mu.Lock()
	was := map[int64]eventlog.EventInfo{}
	for c := range h.open {
		if s := c.stuck; s != nil && s.Event != nil {
			was[s.Event.Seq] = *s.Event
		}
	}
	h.mu.Unlock()
	for seq, before := range was {
		ictx, cancel := context.WithTimeout(ctx, stuckLocateTimeout)
		now, err := h.cfg.Inspect(ictx, seq)
		cancel()
		if err != nil || (now != nil && sameEvent(before, *now)) {
			continue
		}
		h.repaired(before, now)
	}
}

// sameEvent says whether an event is still as it was when a consumer got
// stuck on it.
func sameEvent(a, b eventlog.EventInfo) bool {
	return a.Seq == b.Seq && a.Kind == b.Kind && a.FrameBytes == b.FrameBytes &&
		a.BlocksBytes == b.BlocksBytes && a.Ops == b.Ops && a.Invalidated == b.Invalidated
}

// repaired ends the incidents of the consumers stuck on the event before
// (now is what its seq holds now: nil or a later event when it is gone),
// releases their held connections and forgets their admission refusals, so
// that each reconnects and is served at once.
func (h *Health) repaired(before eventlog.EventInfo, now *eventlog.EventInfo) {
	h.mu.Lock()
	var ips []string
	held := 0
	for c := range h.open {
		if s := c.stuck; s != nil && s.Event != nil && s.Event.Seq == before.Seq {
			ips = append(ips, c.key.ip)
			held += s.Held
			h.endStuck(c)
		}
	}
	h.mu.Unlock()
	if len(ips) == 0 {
		return
	}
	attrs := []any{"seq", before.Seq, "was_kind", before.Kind, "was_frame_bytes", before.FrameBytes, "consumers", len(ips), "held", held}
	switch {
	case now == nil || now.Seq != before.Seq:
		attrs = append(attrs, "now", "gone")
	case now.Invalidated:
		attrs = append(attrs, "now", "invalidated")
	default:
		attrs = append(attrs, "now_kind", now.Kind, "now_frame_bytes", now.FrameBytes)
	}
	h.log.Info("firehose event repaired: the consumers stuck on it are served again", attrs...)
	if a := h.admission.Load(); a != nil {
		for _, ip := range ips {
			a.Forgive(ip)
		}
	}
}

// UseAdmission makes a repair forget the admission refusals of the
// consumers stuck on the repaired event (Admission.Forgive), so that a
// client refused while it was stuck is admitted on its next attempt.
func (h *Health) UseAdmission(a *Admission) { h.admission.Store(a) }

// logLine is a log record decided under h.mu and written after it is
// released.
type logLine struct {
	level slog.Level
	msg   string
	attrs []any
}

func (h *Health) emit(logs []logLine) {
	for _, l := range logs {
		h.log.Log(context.Background(), l.level, l.msg, l.attrs...)
	}
}
