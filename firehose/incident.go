package firehose

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// Runs of failed connections and cursors beyond our head: each is one
// warning when it starts, counted silently while it lasts, and one line
// with the count when it ends, however fast the consumer redials.

// FailureInfo is a consumer's run of failed connections.
type FailureInfo struct {
	Since       time.Time `json:"since"`
	LastFailure time.Time `json:"lastFailure"`
	// Failures counts the failed connections of the run.
	Failures   int64     `json:"failures"`
	LastReason EndReason `json:"lastReason"`
}

// FutureCursorInfo is a consumer asking for a cursor beyond our newest
// event: our sequence went back (a backup restored, a database replaced)
// after it had read further. It is refused with FutureCursor until our
// sequence is raised past its cursor.
type FutureCursorInfo struct {
	// Cursor is the highest cursor it asked for; Head our newest seq then.
	Cursor int64     `json:"cursor"`
	Head   int64     `json:"head"`
	Since  time.Time `json:"since"`
	Last   time.Time `json:"last"`
	// Refusals counts the connections refused with FutureCursor.
	Refusals int64 `json:"refusals"`
	// Command raises our sequence past its cursor.
	Command string `json:"command"`
}

// failureRun is a consumer's run of failed connections.
type failureRun struct {
	FailureInfo
	// refusedAt is the consumer's refusal count when the run began.
	refusedAt int64
	// stuck is the stuck incident of the run that ended (repaired) before
	// the run did, for the summary.
	stuck *StuckInfo
	// quiet: its start was not logged (allowWarning), nor is its end.
	quiet bool
}

// Timing of the end of a run of failures: a connection served for
// recoverAfter with frames sent, or quietAfter without, ends it (the
// consumer is reading); recoverAfter is long enough that a connection
// about to fail on the frame it was just sent is not taken for a
// recovery.
const (
	recoverAfter = 5 * time.Second
	quietAfter   = time.Minute
)

// maxErrorText bounds the error text logged for a failed connection.
const maxErrorText = 200

// Incident warnings (a run of failures starting, a cursor beyond our
// head) are one per consumer, and a consumer is an address and a
// User-Agent, which a client chooses: across all consumers at most
// warnBurst of them, then warnRate, are logged; the others are still
// tracked and shown (admin API, console), and counted in the next
// warning logged.
const (
	warnRate  = rate.Limit(1.0 / 6) // 10 a minute
	warnBurst = 20
)

// allowWarning says whether an incident warning may be logged now, and
// how many were held back since the last one. h.mu held.
func (h *Health) allowWarning() (ok bool, held int64) {
	if !h.warnings.Allow() {
		h.warningsHeld++
		return false, 0
	}
	held, h.warningsHeld = h.warningsHeld, 0
	return true, held
}

// noteEnd counts a connection that ended in its consumer's run of
// failures, starting one (with a warning) if none is going on, and ends
// the run when a connection that was served frames closes cleanly.
// h.mu held.
func (h *Health) noteEnd(conn *Conn, err error, now time.Time, logs []logLine) []logLine {
	c := conn.c
	if !conn.reason.failed() {
		if c.failing != nil && conn.reason == EndClientClosed && conn.frames.Load() > 0 {
			logs = h.recovered(c, "firehose consumer recovered", now, logs)
		}
		return logs
	}
	if f := c.failing; f != nil {
		f.Failures++
		f.LastFailure, f.LastReason = now, conn.reason
		return logs
	}
	c.failing = &failureRun{FailureInfo: FailureInfo{Since: now, LastFailure: now, Failures: 1, LastReason: conn.reason}, refusedAt: c.refused}
	h.open[c] = struct{}{}
	ok, held := h.allowWarning()
	if !ok {
		c.failing.quiet = true
		return logs
	}
	attrs := []any{"ip", c.key.ip, "user_agent", c.key.ua, "reason", conn.reason, "frames", conn.frames.Load()}
	if held > 0 {
		attrs = append(attrs, "other_incidents_not_logged", held)
	}
	if conn.cursor != nil {
		attrs = append(attrs, "cursor", *conn.cursor)
	}
	if err != nil {
		msg := err.Error()
		if len(msg) > maxErrorText {
			msg = strings.ToValidUTF8(msg[:maxErrorText], "")
		}
		attrs = append(attrs, "err", msg)
	}
	return append(logs, logLine{slog.LevelWarn, "firehose consumer's connection failed; its next failures are counted, not logged, until it recovers", attrs})
}

// recovered ends c's run of failures and its stuck incident, with one
// line counting what happened meanwhile. h.mu held.
func (h *Health) recovered(c *consumer, msg string, now time.Time, logs []logLine) []logLine {
	quiet := c.failing != nil && c.failing.quiet && c.stuck == nil
	attrs := []any{"ip", c.key.ip, "user_agent", c.key.ua}
	s := c.stuck
	if s == nil && c.failing != nil {
		s = c.failing.stuck
	}
	if s != nil {
		attrs = append(attrs, "was_stuck_at", s.Seq, "reconnects", s.Reconnects)
	}
	if f := c.failing; f != nil {
		attrs = append(attrs, "failures", f.Failures, "refused", c.refused-f.refusedAt, "for", now.Sub(f.Since).Round(time.Millisecond))
	}
	c.failing = nil
	h.endStuck(c)
	if quiet {
		return logs
	}
	return append(logs, logLine{slog.LevelInfo, msg, attrs})
}

// settle forgets c as an open incident once nothing is going on. h.mu
// held.
func (h *Health) settle(c *consumer) {
	if c.stuck == nil && c.failing == nil && c.future == nil {
		delete(h.open, c)
	}
}

// FutureCursor records that the connection was refused with FutureCursor:
// it asked for a cursor beyond head, our newest seq. The consumer's first
// refusal is a warning naming the command that lets it back in; the next
// ones are counted.
func (c *Conn) FutureCursor(head int64) {
	if c.cursor == nil {
		return
	}
	h, cs, cur, now := c.h, c.c, *c.cursor, time.Now()
	h.mu.Lock()
	if f := cs.future; f != nil {
		f.Refusals++
		f.Last, f.Head = now, head
		if cur > f.Cursor {
			f.Cursor, f.Command = cur, raiseSeqCommand(cur)
		}
		h.mu.Unlock()
		return
	}
	f := &FutureCursorInfo{Cursor: cur, Head: head, Since: now, Last: now, Refusals: 1, Command: raiseSeqCommand(cur)}
	cs.future = f
	h.open[cs] = struct{}{}
	ok, held := h.allowWarning()
	h.mu.Unlock()
	if !ok {
		return
	}
	// The cursor is the client's word: the command is for a consumer the
	// operator knows (a relay, its app view), and ahead_by says how far.
	attrs := []any{"ip", cs.key.ip, "user_agent", cs.key.ua, "cursor", cur, "head", head, "ahead_by", cur - head, "command", f.Command}
	if held > 0 {
		attrs = append(attrs, "other_incidents_not_logged", held)
	}
	h.log.Warn("firehose consumer asks for a cursor beyond our newest event and is refused (FutureCursor): "+
		"our sequence went back, as after restoring a backup; until it is raised past the consumer's cursor, "+
		"the consumer reads nothing from us; if it is one you know (a relay, your app view), run the command given", attrs...)
}

// raiseSeqCommand is the admin command that puts our next seq past cursor
// (raise-seq makes the last seq at least the floor, the next one above
// it), so that the cursor is our head and the consumer is served live.
func raiseSeqCommand(cursor int64) string {
	return fmt.Sprintf("bulwark admin firehose raise-seq --floor %d --reason %q", cursor, "consumers ahead of our sequence")
}

// Served records that the connection's cursor was accepted: its consumer,
// if it was ahead of our sequence, no longer is.
func (c *Conn) Served() {
	h, cs := c.h, c.c
	h.mu.Lock()
	f := cs.future
	cs.future = nil
	if f != nil {
		h.settle(cs)
	}
	h.mu.Unlock()
	if f != nil {
		h.log.Info("firehose consumer's cursor is within our sequence again", "ip", cs.key.ip, "user_agent", cs.key.ua,
			"was_cursor", f.Cursor, "refusals", f.Refusals, "for", time.Since(f.Since).Round(time.Millisecond))
	}
}

// Run notices repaired events (every RepairPoll) and the end of incidents
// until ctx ends. Hub.Run runs it.
func (h *Health) Run(ctx context.Context) error {
	t := time.NewTicker(h.cfg.RepairPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		h.checkRepairs(ctx)
		h.mu.Lock()
		logs := h.closeIncidents(time.Now(), nil)
		h.mu.Unlock()
		h.emit(logs)
	}
}

// closeIncidents ends the runs of failures of consumers now reading, or
// gone quiet for Window, and forgets consumers no longer asking for a
// future cursor. h.mu held.
func (h *Health) closeIncidents(now time.Time, logs []logLine) []logLine {
	for c := range h.open {
		if f := c.future; f != nil && c.active == 0 && now.Sub(f.Last) >= h.cfg.Window {
			c.future = nil
			h.settle(c)
		}
		f := c.failing
		if f == nil {
			continue
		}
		switch {
		case c.reading(now):
			logs = h.recovered(c, "firehose consumer recovered", now, logs)
		case c.active == 0 && c.stuck == nil && now.Sub(f.LastFailure) >= h.cfg.Window:
			logs = h.recovered(c, "firehose consumer stopped reconnecting after failed connections", now, logs)
		}
	}
	return logs
}

// reading says whether one of c's connections is being served: for
// recoverAfter with frames sent, or quietAfter without (nothing new to
// send). A held connection is not. h.mu held.
func (c *consumer) reading(now time.Time) bool {
	for _, conn := range c.recent {
		if !conn.ended.IsZero() || conn.hold {
			continue
		}
		up := now.Sub(conn.serving)
		if up >= quietAfter || (up >= recoverAfter && conn.frames.Load() > 0) {
			return true
		}
	}
	return false
}
