package relaywatch

import (
	"time"
)

// State is what the watch concludes about one relay.
type State string

// The states of a relay.
const (
	// StatePending: not checked yet, or the relay knows us but has not
	// reported a seq for us yet.
	StatePending State = "pending"
	// StateHealthy: the relay is reading our firehose and keeping up.
	StateHealthy State = "healthy"
	// StateBehind: the relay trails our head by more than BehindEvents
	// seqs, or its oldest unread event is older than BehindFor.
	StateBehind State = "behind"
	// StateStuck: the relay reported the same seq on StuckChecks checks in
	// a row while newer events exist, the first of them for StuckFor: it
	// cannot get past the next one.
	StateStuck State = "stuck"
	// StateAhead: the relay's seq for us is above our head (our sequence
	// went back, e.g. a restored database): it will refuse our stream
	// (FutureCursor) until our sequence is raised past it.
	StateAhead State = "ahead"
	// StateThrottled: the relay says it throttles us.
	StateThrottled State = "throttled"
	// StateBanned: the relay says it has banned us.
	StateBanned State = "banned"
	// StateDisconnected: the relay knows us but says it is not reading
	// our firehose (status idle or offline); the watch asks it to crawl.
	StateDisconnected State = "disconnected"
	// StateUnknown: the relay does not know us (HostNotFound); the watch
	// asks it to crawl.
	StateUnknown State = "unknown"
	// StateUnreachable: the relay's answer could not be had or read.
	StateUnreachable State = "unreachable"
)

// States lists every State, the most urgent first.
var States = []State{
	StateStuck, StateBanned, StateAhead, StateThrottled, StateBehind,
	StateDisconnected, StateUnknown, StateUnreachable, StatePending, StateHealthy,
}

// severityRank orders states for Snapshot: higher is worse.
var severityRank = func() map[State]int {
	m := map[State]int{}
	for i, s := range States {
		m[s] = len(States) - i
	}
	return m
}()

// relay is one watched relay. Fields are guarded by Watch.mu.
type relay struct {
	url        string
	name       string
	configured bool
	observedAt time.Time

	state        State
	since        time.Time
	checkedAt    time.Time
	relayStatus  string
	accountCount *int64
	seq          int64
	hasSeq       bool
	advancedAt   time.Time
	sameChecks   int
	head         int64
	hasHead      bool
	unreadAge    time.Duration
	err          string
	event        *EventInfo
	eventErr     string
	command      string
	crawledAt    time.Time
	crawlErr     string
	// warned holds the problem states warned of since the relay was last
	// healthy, with the relay's seq then: re-entering one is not repeated.
	warned map[State]int64
}

// Report is what the console shows of one relay.
type Report struct {
	// Relay is the relay's host name; URL its base URL.
	Relay string `json:"relay"`
	URL   string `json:"url"`
	// Configured is false for relays added by Observe.
	Configured bool      `json:"configured"`
	State      State     `json:"state"`
	Since      time.Time `json:"since"`
	CheckedAt  time.Time `json:"checkedAt,omitzero"`
	// RelayStatus is what the relay says of us: active, idle, offline,
	// throttled or banned.
	RelayStatus  string `json:"relayStatus,omitempty"`
	AccountCount *int64 `json:"accountCount,omitempty"`
	// Seq is the last seq of ours the relay reported; Head our head at the
	// last check; Lag the difference (negative when the relay is ahead).
	Seq  *int64 `json:"seq,omitempty"`
	Head *int64 `json:"head,omitempty"`
	Lag  *int64 `json:"lag,omitempty"`
	// UnreadSeconds is how long, at least, the relay's oldest unread
	// event has waited.
	UnreadSeconds int64 `json:"unreadSeconds,omitempty"`
	// AdvancedAt is when the relay's seq last moved forward.
	AdvancedAt time.Time `json:"advancedAt,omitzero"`
	// SameSeqChecks counts checks in a row at Seq while newer events exist.
	SameSeqChecks int `json:"sameSeqChecks,omitempty"`
	// Error is why the last check failed.
	Error string `json:"error,omitempty"`
	// Event is the event the relay cannot get past (behind or stuck);
	// EventError why it could not be described.
	Event      *EventInfo `json:"event,omitempty"`
	EventError string     `json:"eventError,omitempty"`
	// Command is the bulwark admin command that would repair it.
	Command          string    `json:"command,omitempty"`
	CrawlRequestedAt time.Time `json:"crawlRequestedAt,omitzero"`
	CrawlError       string    `json:"crawlError,omitempty"`
}

// report copies r. Watch.mu held.
func (r *relay) report() Report {
	rep := Report{
		Relay: r.name, URL: r.url, Configured: r.configured, State: r.state, Since: r.since,
		CheckedAt: r.checkedAt, RelayStatus: r.relayStatus, AdvancedAt: r.advancedAt,
		SameSeqChecks: r.sameChecks, Error: r.err, EventError: r.eventErr, Command: r.command,
		CrawlRequestedAt: r.crawledAt, CrawlError: r.crawlErr, UnreadSeconds: int64(r.unreadAge / time.Second),
	}
	if r.accountCount != nil {
		n := *r.accountCount
		rep.AccountCount = &n
	}
	if r.hasSeq {
		seq := r.seq
		rep.Seq = &seq
	}
	if r.hasHead {
		head := r.head
		rep.Head = &head
		if r.hasSeq {
			lag := r.head - r.seq
			rep.Lag = &lag
		}
	}
	if r.event != nil {
		ev := *r.event
		rep.Event = &ev
	}
	return rep
}

// step is what one check of one relay changed, and what is left to do
// outside the lock.
type step struct {
	r         *relay
	from, to  State
	fromSince time.Time
	crawl     bool // ask the relay to crawl us
	locate    bool // describe the event after the relay's seq
	quiet     bool // already warned of this since the relay was healthy
	report    Report
}

// apply records one relay's answer and decides its state. w.mu held.
func (w *Watch) apply(r *relay, o observation, head headObs, now time.Time) step {
	if w.relays[r.name] != r {
		return step{} // forgotten while it was being checked
	}
	w.m.checked(r.name, o.result)
	r.checkedAt = now
	if head.ok {
		r.head, r.hasHead = head.seq, true
	}
	st := step{r: r, from: r.state, fromSince: r.since}
	st.to = w.classify(r, o, head, now)
	if st.to != st.from {
		r.state, r.since = st.to, now
		w.m.setState(r.name, st.to)
		st.quiet = w.warnOnce(r, st.to)
	}
	if r.hasSeq && r.hasHead {
		w.m.lagSet(r.name, r.head-r.seq)
	}
	wantCrawl := st.to == StateUnknown || o.status == "idle" || o.status == "offline"
	if wantCrawl && (r.crawledAt.IsZero() || now.Sub(r.crawledAt) >= w.cfg.CrawlInterval) {
		st.crawl, r.crawledAt = true, now
	}
	lagging := func(s State) bool { return s == StateBehind || s == StateStuck }
	switch {
	case lagging(st.to) && (!lagging(st.from) || st.to == StateStuck && st.from == StateBehind):
		st.locate = true
		r.event, r.eventErr, r.command = nil, "", ""
	case st.to == StateAhead:
		r.event, r.eventErr, r.command = nil, "", raiseCommand(r.seq)
	case !lagging(st.to):
		r.event, r.eventErr, r.command = nil, "", ""
	}
	st.report = r.report()
	return st
}

// warnOnce records that r enters s and says whether the operator has
// already been told since r was last healthy (the same state, and for a
// lagging relay the same seq): a relay flapping between stuck and
// unreachable is reported once. w.mu held.
func (w *Watch) warnOnce(r *relay, s State) (quiet bool) {
	switch s {
	case StateHealthy:
		r.warned = nil
		return false
	case StatePending, StateUnknown:
		return false
	}
	lagging := s == StateBehind || s == StateStuck || s == StateAhead
	if seq, ok := r.warned[s]; ok && (!lagging || seq == r.seq) {
		return true
	}
	if r.warned == nil {
		r.warned = map[State]int64{}
	}
	r.warned[s] = r.seq
	return false
}

// classify turns a relay's answer into its state. w.mu held.
func (w *Watch) classify(r *relay, o observation, head headObs, now time.Time) State {
	switch o.result {
	case resultNotFound:
		r.err, r.relayStatus, r.accountCount = "", "", nil
		return StateUnknown
	case resultOK:
	default:
		r.err = o.err
		return StateUnreachable
	}
	r.err, r.relayStatus, r.accountCount = "", o.status, o.accountCount
	w.noteSeq(r, o, head, now)
	switch {
	case o.status == "banned":
		return StateBanned
	case o.status == "throttled":
		return StateThrottled
	case head.ok && r.hasSeq && r.seq > head.seq:
		// Before idle: a relay refused with FutureCursor goes idle, and
		// only raising our sequence brings it back.
		return StateAhead
	case o.status == "idle" || o.status == "offline":
		return StateDisconnected
	}
	return w.lagState(r, head, now)
}

// noteSeq records the relay's seq and counts checks without progress.
// w.mu held.
func (w *Watch) noteSeq(r *relay, o observation, head headObs, now time.Time) {
	if !o.hasSeq || o.seq < 0 {
		// indigo reports -1 until it has persisted a seq for us.
		return
	}
	if !r.hasSeq || o.seq != r.seq {
		if !r.hasSeq || o.seq > r.seq {
			r.advancedAt = now
		}
		r.sameChecks = 0
	}
	r.seq, r.hasSeq = o.seq, true
	switch {
	case !head.ok:
	case r.seq < head.seq:
		r.sameChecks++
	default:
		r.sameChecks = 0
	}
	r.unreadAge = 0
	if head.ok && r.seq < head.seq {
		r.unreadAge = w.unreadAge(r.seq, now)
	}
}

// lagState judges an active relay by its seq against our head. w.mu held.
func (w *Watch) lagState(r *relay, head headObs, now time.Time) State {
	if !head.ok {
		// No head this time: keep what lag said last, or take the relay's
		// word that it is active.
		switch r.state {
		case StateHealthy, StateBehind, StateStuck, StateAhead:
			return r.state
		}
		if !r.hasSeq && w.cfg.Head != nil {
			return StatePending
		}
		return StateHealthy
	}
	switch {
	case !r.hasSeq:
		return StatePending
	case r.seq >= head.seq:
		return StateHealthy
	case r.sameChecks >= w.cfg.StuckChecks && r.unreadAge >= w.cfg.StuckFor:
		return StateStuck
	case head.seq-r.seq > w.cfg.BehindEvents || r.unreadAge > w.cfg.BehindFor:
		return StateBehind
	}
	return StateHealthy
}
