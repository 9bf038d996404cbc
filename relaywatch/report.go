package relaywatch

import (
	"context"
	"fmt"
	"time"
)

// locateWindow bounds how many events past a stuck relay's seq are
// described while looking for one that breaks a limit.
const locateWindow = 8

// Alerter hears of relays entering stuck, ahead, throttled or banned.
// Alert runs on the check's goroutine and must not block.
type Alerter interface {
	Alert(Incident)
}

// AlerterFunc adapts a function to Alerter.
type AlerterFunc func(Incident)

// Alert calls f.
func (f AlerterFunc) Alert(i Incident) { f(i) }

// Incident is one relay entering a state the operator must hear of.
type Incident struct {
	// Kind is "relay_" and the state: relay_stuck, relay_ahead,
	// relay_throttled or relay_banned.
	Kind string
	// Severity is "critical" (stuck, ahead, banned) or "warning".
	Severity string
	// Relay is the relay's host name.
	Relay string
	// Summary is one line for a human.
	Summary string
	// Report is the relay's state when it happened.
	Report Report
}

// follow does a step's I/O outside the lock (the crawl request, the event
// lookups), then logs and alerts.
func (w *Watch) follow(ctx context.Context, st *step) {
	if st.r == nil {
		return
	}
	if st.crawl {
		w.askCrawl(ctx, st)
	}
	if st.locate {
		w.describe(ctx, st)
	}
	w.announce(st)
}

// askCrawl asks the relay to crawl us and records the outcome.
func (w *Watch) askCrawl(ctx context.Context, st *step) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	msg := ""
	if err := w.crawl(ctx, st.r.url); err != nil {
		msg = bounded(err.Error())
		w.log.Warn("requestCrawl to relay failed", "relay", st.r.name, "state", st.to, "err", msg)
	} else {
		w.log.Info("asked the relay to crawl this server", "relay", st.r.name, "state", st.to)
	}
	w.mu.Lock()
	st.r.crawlErr = msg
	w.mu.Unlock()
	st.report.CrawlError = msg
}

// describe finds the event a lagging relay cannot get past and the command
// that would repair it.
func (w *Watch) describe(ctx context.Context, st *step) {
	if st.report.Seq == nil {
		return
	}
	seq := *st.report.Seq
	var ev *EventInfo
	evErr := ""
	if w.cfg.Events != nil {
		var err error
		if ev, err = w.locate(ctx, seq, st.to == StateStuck); err != nil {
			evErr = bounded(err.Error())
		}
	}
	cmd := fixCommand(st.r.name, seq, st.to, ev)
	w.mu.Lock()
	st.r.event, st.r.eventErr, st.r.command = ev, evErr, cmd
	w.mu.Unlock()
	st.report.Event, st.report.EventError, st.report.Command = ev, evErr, cmd
}

// locate describes the event after the relay's seq: the relay persists the
// last seq it finished, so the one it cannot pass is the next. For a stuck
// relay, the first of the next few that breaks a protocol limit is the
// likelier culprit (a relay may persist a seq a little behind what it
// finished), so up to locateWindow events are looked at.
func (w *Watch) locate(ctx context.Context, relaySeq int64, stuck bool) (*EventInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	first, err := w.cfg.Events.EventAt(ctx, relaySeq+1)
	if err != nil {
		return nil, fmt.Errorf("describing the event after seq %d: %w", relaySeq, err)
	}
	if !stuck || first.BrokenLimit != "" {
		return &first, nil
	}
	ev := first
	for range locateWindow - 1 {
		next, err := w.cfg.Events.EventAt(ctx, ev.Seq+1)
		if err != nil || next.Seq <= ev.Seq {
			break
		}
		if next.BrokenLimit != "" {
			return &next, nil
		}
		ev = next
	}
	return &first, nil
}

// fixCommand is the bulwark admin command that would get a lagging relay
// past the event after relaySeq: rewriting it as #sync when it breaks a
// limit, else a fresh #sync of its repo; failing a description, the
// command that lists the events there.
func fixCommand(relay string, relaySeq int64, s State, ev *EventInfo) string {
	reason := fmt.Sprintf("relay %s %s at seq %d", relay, s, relaySeq)
	switch {
	case ev != nil && ev.BrokenLimit != "":
		return fmt.Sprintf("bulwark admin firehose rewrite-as-sync --seq %d --reason %q", ev.Seq, reason)
	case ev != nil && ev.DID != "":
		return fmt.Sprintf("bulwark admin firehose emit-sync --did %s --reason %q", ev.DID, reason)
	}
	return fmt.Sprintf("bulwark admin firehose events --from %d --limit 20", relaySeq+1)
}

// raiseCommand is the command that lifts our sequence past a relay's seq.
func raiseCommand(relaySeq int64) string {
	return fmt.Sprintf("bulwark admin firehose raise-seq --floor %d --reason %q", relaySeq+1, "relay ahead of our sequence")
}

// announce logs a state change once, and alerts when it must.
func (w *Watch) announce(st *step) {
	if st.from == st.to || st.quiet {
		return
	}
	rep := st.report
	attrs := reportAttrs(rep)
	switch st.to {
	case StateStuck:
		w.log.Warn("relay is stuck on our firehose: its seq for us has not moved across several checks while newer events exist, so it cannot get past the next event; repair it with the command given", attrs...)
	case StateBehind:
		if st.from == StateStuck {
			w.log.Info("relay got past the event it was stuck on and is catching up", attrs...)
			return
		}
		w.log.Warn("relay is behind on our firehose; if it does not catch up, repair the event after its seq with the command given", attrs...)
	case StateAhead:
		w.log.Warn("relay's seq for us is above our newest event: it will refuse our firehose (FutureCursor) until our sequence is raised past it with the command given", attrs...)
	case StateThrottled:
		w.log.Warn("relay says it throttles this server: it may drop or delay our events", attrs...)
	case StateBanned:
		w.log.Warn("relay says it has banned this server: it reads none of our events; only its operators can lift the ban", attrs...)
	case StateDisconnected:
		w.log.Warn("relay knows this server but says it is not reading our firehose (status idle or offline); asking it to crawl again", attrs...)
	case StateUnknown:
		w.log.Info("relay does not know this server; asking it to crawl", attrs...)
	case StateUnreachable:
		w.log.Warn("cannot read the relay's status for this server", append(attrs, "err", rep.Error)...)
	case StateHealthy:
		if st.from != StatePending {
			w.log.Info("relay recovered", append(attrs, "was", st.from, "for", rep.Since.Sub(st.fromSince).Round(time.Second))...)
		}
	}
	w.alert(st.to, rep)
}

// alert tells the Alerter of the states it must hear of.
func (w *Watch) alert(s State, rep Report) {
	if w.cfg.Alerter == nil {
		return
	}
	inc := Incident{Kind: "relay_" + string(s), Severity: "critical", Relay: rep.Relay, Report: rep}
	seq := "no seq"
	if rep.Seq != nil {
		seq = fmt.Sprintf("seq %d", *rep.Seq)
	}
	switch s {
	case StateStuck:
		inc.Summary = fmt.Sprintf("relay %s is stuck at %s", rep.Relay, seq)
		if ev := rep.Event; ev != nil {
			inc.Summary += fmt.Sprintf(", before #%s event %d (%d bytes", ev.Kind, ev.Seq, ev.Size)
			if ev.BrokenLimit != "" {
				inc.Summary += "; " + ev.BrokenLimit
			}
			inc.Summary += ")"
		}
		inc.Summary += "; repair: " + rep.Command
	case StateAhead:
		inc.Summary = fmt.Sprintf("relay %s is at %s, above our newest event; repair: %s", rep.Relay, seq, rep.Command)
	case StateBanned:
		inc.Summary = fmt.Sprintf("relay %s says it has banned this server", rep.Relay)
	case StateThrottled:
		inc.Severity = "warning"
		inc.Summary = fmt.Sprintf("relay %s says it throttles this server", rep.Relay)
	default:
		return
	}
	w.cfg.Alerter.Alert(inc)
}

// reportAttrs are the log attributes of a relay's report.
func reportAttrs(rep Report) []any {
	attrs := []any{"relay", rep.Relay, "state", rep.State}
	if rep.RelayStatus != "" {
		attrs = append(attrs, "relay_status", rep.RelayStatus)
	}
	if rep.Seq != nil {
		attrs = append(attrs, "relay_seq", *rep.Seq)
	}
	if rep.Head != nil {
		attrs = append(attrs, "head", *rep.Head)
	}
	if rep.Lag != nil {
		attrs = append(attrs, "lag", *rep.Lag)
	}
	if rep.UnreadSeconds > 0 {
		attrs = append(attrs, "unread_for", time.Duration(rep.UnreadSeconds)*time.Second)
	}
	if rep.SameSeqChecks > 0 && rep.State == StateStuck {
		attrs = append(attrs, "checks_at_seq", rep.SameSeqChecks)
	}
	if ev := rep.Event; ev != nil {
		attrs = append(attrs, "seq", ev.Seq, "kind", ev.Kind, "did", ev.DID, "size", ev.Size)
		if ev.BrokenLimit != "" {
			attrs = append(attrs, "breaks_limit", ev.BrokenLimit)
		}
	}
	if rep.EventError != "" {
		attrs = append(attrs, "event_error", rep.EventError)
	}
	if rep.Command != "" {
		attrs = append(attrs, "command", rep.Command)
	}
	return attrs
}
