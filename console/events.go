package console

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// Event list bounds.
const (
	eventsPage = 100
	// eventsScan bounds the events read to fill one page when filtering
	// by size, which the log cannot do for us.
	eventsScan = 10_000
	maxReason  = 500
)

// Repairs the console offers, by form value.
const (
	repairRewrite    = "rewrite"
	repairInvalidate = "invalidate"
	repairEmitSync   = "emit-sync"
)

// eventsView is the firehose page: events newest first.
type eventsView struct {
	Filter eventsFilter
	Events []eventlog.EventInfo
	Head   int64
	// Older and Newer are where the next pages start (to=Older,
	// after=Newer); 0 means no such page.
	Older, Newer int64
	Truncated    bool
}

// eventsFilter is the firehose page's form, as given.
type eventsFilter struct {
	To         string
	After      string
	DID        string
	Kind       string
	MinSize    string
	OverLimits bool
}

// query is the filter as a query string for a paging link: key is "to"
// or "after".
func (f eventsFilter) query(key string, seq int64) string {
	q := url.Values{key: {strconv.FormatInt(seq, 10)}}
	for k, v := range map[string]string{"did": f.DID, "kind": f.Kind, "min": f.MinSize} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.OverLimits {
		q.Set("over", "1")
	}
	return q.Encode()
}

// Page links, for the template (whole URLs: html/template would escape
// a query string's "=" and "&" placed after the "?").
func (v eventsView) OlderURL() template.URL {
	return template.URL(Prefix + "firehose?" + v.Filter.query("to", v.Older))
}

func (v eventsView) NewerURL() template.URL {
	return template.URL(Prefix + "firehose?" + v.Filter.query("after", v.Newer))
}

// parseEventsFilter reads the page's form into an eventlog filter and the
// minimum size.
func parseEventsFilter(q url.Values) (eventsFilter, eventlog.EventFilter, int, error) {
	f := eventsFilter{To: strings.TrimSpace(q.Get("to")), After: strings.TrimSpace(q.Get("after")), DID: strings.TrimSpace(q.Get("did")),
		Kind: q.Get("kind"), MinSize: strings.TrimSpace(q.Get("min")), OverLimits: q.Get("over") != ""}
	ef := eventlog.EventFilter{Kind: eventlog.Kind(f.Kind), OverLimits: f.OverLimits, Limit: eventsPage}
	switch ef.Kind {
	case "", eventlog.KindCommit, eventlog.KindSync, eventlog.KindIdentity, eventlog.KindAccount:
	default:
		return f, ef, 0, badRequest("Kind must be commit, sync, identity or account.")
	}
	if f.DID != "" {
		did, err := syntax.ParseDID(f.DID)
		if err != nil {
			return f, ef, 0, badRequest("%q is not a DID.", truncate(100, f.DID))
		}
		ef.DID = did.String()
	}
	minSize := 0
	if f.MinSize != "" {
		var err error
		if minSize, err = strconv.Atoi(f.MinSize); err != nil || minSize < 0 {
			return f, ef, 0, badRequest("The minimum size must be a number of bytes.")
		}
	}
	seq := func(v string) (int64, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, badRequest("%q must be a seq.", truncate(40, v))
		}
		return n, nil
	}
	switch {
	case f.After != "":
		after, err := seq(f.After)
		if err != nil {
			return f, ef, 0, err
		}
		ef.FromSeq = after + 1
	case f.To != "":
		to, err := seq(f.To)
		if err != nil {
			return f, ef, 0, err
		}
		ef.Newest, ef.ToSeq = true, to
	default:
		ef.Newest = true
	}
	return f, ef, minSize, nil
}

// handleEvents lists events newest first, a page at a time: from the head,
// from a seq down (to=), or the page above a seq (after=).
func (c *Console) handleEvents(w http.ResponseWriter, r *http.Request, s session) error {
	ctx := r.Context()
	f, ef, minSize, err := parseEventsFilter(r.URL.Query())
	if err != nil {
		return err
	}
	head, err := c.cfg.Log.LastSeq(ctx)
	if err != nil {
		return err
	}
	v := eventsView{Filter: f, Head: head}
	if ef.Newest && (ef.ToSeq == 0 || ef.ToSeq > head) {
		ef.ToSeq = head
	}
	scanned := 0
	for head > 0 && len(v.Events) < eventsPage && scanned < eventsScan {
		evs, err := c.cfg.Log.Inspect(ctx, ef)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if e.FrameBytes >= minSize && len(v.Events) < eventsPage {
				v.Events = append(v.Events, e)
			}
		}
		scanned += len(evs)
		if len(evs) < ef.Limit || minSize == 0 {
			break
		}
		if ef.Newest {
			if ef.ToSeq = evs[len(evs)-1].Seq - 1; ef.ToSeq < 1 {
				break
			}
		} else {
			ef.FromSeq = evs[len(evs)-1].Seq + 1
		}
		ef.Limit = 1000
	}
	if !ef.Newest {
		slices.Reverse(v.Events)
	}
	v.Truncated = scanned >= eventsScan
	if n := len(v.Events); n > 0 {
		if v.Events[n-1].Seq > 1 {
			v.Older = v.Events[n-1].Seq - 1
		}
		if v.Events[0].Seq < head {
			v.Newer = v.Events[0].Seq
		}
	}
	return c.show(w, s, "firehose", "Firehose", "events", v)
}

// eventView is one event's page, and its confirmation page.
type eventView struct {
	Event    eventlog.EventInfo
	Ops      []eventlog.Op
	CanSync  bool // repo.SyncEvent is available for emit-sync
	Action   string
	Title    string
	Explain  []string
	Result   *eventlog.RepairResult
	SyncRev  string
	Message  string
	Repaired bool
}

// lookupEvent reads the event at the path's seq (invalidated or not).
func (c *Console) lookupEvent(r *http.Request) (eventlog.EventInfo, error) {
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || seq <= 0 {
		return eventlog.EventInfo{}, badRequest("%q is not an event seq.", truncate(40, r.PathValue("seq")))
	}
	evs, err := c.cfg.Log.Inspect(r.Context(), eventlog.EventFilter{FromSeq: seq, ToSeq: seq, Limit: 1})
	if err != nil {
		return eventlog.EventInfo{}, err
	}
	if len(evs) == 0 {
		return eventlog.EventInfo{}, notFound("There is no event with seq %d: it was never written, or retention has pruned it.", seq)
	}
	return evs[0], nil
}

func (c *Console) handleEvent(w http.ResponseWriter, r *http.Request, s session) error {
	ev, err := c.lookupEvent(r)
	if err != nil {
		return err
	}
	ops, err := c.cfg.Log.Ops(r.Context(), ev.Seq)
	if err != nil {
		return err
	}
	return c.show(w, s, "firehose", fmt.Sprintf("Event %d", ev.Seq), "event", eventView{Event: ev, Ops: ops, CanSync: c.cfg.Sync != nil})
}

// explain says what a repair of ev will do, or refuses one that does not
// apply.
func (c *Console) explain(ev eventlog.EventInfo, action string) (string, []string, error) {
	switch action {
	case repairRewrite:
		if ev.Kind != eventlog.KindCommit && ev.Kind != eventlog.KindSync {
			return "", nil, conflict("Event %d is a #%s: only a #commit or #sync can be rewritten as #sync.", ev.Seq, ev.Kind)
		}
		return "Rewrite as #sync", []string{
			fmt.Sprintf("Event %d (#%s of %s, rev %s, %s) is replaced by a #sync of the same repository at the same rev, keeping seq %d; its blocks hold only the signed commit.", ev.Seq, ev.Kind, ev.DID, ev.Rev, humanBytes(int64(ev.FrameBytes)), ev.Seq),
			"Consumers stuck on it read the #sync instead and fetch the repository again.",
			"The change is recorded in the audit log. Rewriting a compliant #sync changes nothing.",
		}, nil
	case repairInvalidate:
		return "Invalidate", []string{
			fmt.Sprintf("Event %d (#%s of %s) is no longer served: consumers skip it, leaving a gap in seqs, which the protocol allows.", ev.Seq, ev.Kind, ev.DID),
			"Consumers that never saw it lose what it said: prefer rewriting a #commit as #sync, or emit a fresh #sync after invalidating.",
			"The change is recorded in the audit log.",
		}, nil
	case repairEmitSync:
		if c.cfg.Sync == nil {
			return "", nil, conflict("This console cannot build #sync events.")
		}
		return "Emit a fresh #sync", []string{
			fmt.Sprintf("A new #sync event of %s, at its repository's current commit, is appended to the firehose with the next seq.", ev.DID),
			fmt.Sprintf("Event %d stays as it is; consumers that lost track of the repository fetch it again.", ev.Seq),
			"The change is recorded in the audit log.",
		}, nil
	}
	return "", nil, badRequest("Unknown repair %q.", truncate(40, action))
}

func (c *Console) handleConfirm(w http.ResponseWriter, r *http.Request, s session) error {
	ev, err := c.lookupEvent(r)
	if err != nil {
		return err
	}
	action := r.URL.Query().Get("action")
	title, explain, err := c.explain(ev, action)
	if err != nil {
		return err
	}
	if ev.Invalidated && action != repairEmitSync {
		return conflict("Event %d is invalidated: it is not served, so no repair of it applies.", ev.Seq)
	}
	return c.show(w, s, "firehose", title+fmt.Sprintf(": event %d", ev.Seq), "confirm", eventView{Event: ev, Action: action, Title: title, Explain: explain})
}

// handleRepair runs a confirmed repair through the same eventlog
// functions as the admin API, audited as the console.
func (c *Console) handleRepair(w http.ResponseWriter, r *http.Request, s session) error {
	ctx := r.Context()
	ev, err := c.lookupEvent(r)
	if err != nil {
		return err
	}
	action := r.PostForm.Get("action")
	title, _, err := c.explain(ev, action)
	if err != nil {
		return err
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if len(reason) > maxReason {
		return badRequest("The reason is longer than %d bytes.", maxReason)
	}
	v := eventView{Event: ev, Action: action, Title: title, Repaired: true}
	switch action {
	case repairRewrite:
		v.Result, err = c.cfg.Log.RewriteAsSync(ctx, ev.Seq, AuditActor, reason)
	case repairInvalidate:
		v.Result, err = c.cfg.Log.Invalidate(ctx, ev.Seq, AuditActor, reason)
	case repairEmitSync:
		v.SyncRev, err = c.cfg.Log.EmitSync(ctx, syntax.DID(ev.DID), c.cfg.Sync, AuditActor, reason)
	}
	switch {
	case errors.Is(err, eventlog.ErrNoEvent):
		return notFound("There is no event with seq %d.", ev.Seq)
	case errors.Is(err, eventlog.ErrNotRepairable):
		return conflict("%s", err.Error())
	case err != nil:
		return err
	}
	changed := v.Result == nil || v.Result.Changed
	c.log.Warn("firehose repair", "op", action, "seq", ev.Seq, "did", ev.DID, "changed", changed, "rev", v.SyncRev, "reason", reason, "actor", AuditActor)
	if !changed {
		v.Message = "Nothing needed changing."
	}
	return c.show(w, s, "firehose", title+fmt.Sprintf(": event %d", ev.Seq), "repaired", v)
}
