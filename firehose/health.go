package firehose

import (
	"container/list"
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// Consumer health: the firehose remembers, per consumer (client IP plus
// user agent, cut to MaxUserAgent bytes), its recent connections, and
// refusals per address; it flags a consumer that keeps
// reconnecting at the same cursor: a relay stuck on the event after it (too
// big for it, or one it cannot verify). The operator hears of it from a log
// warning (once per incident), the admin API and metrics, before users
// notice missing posts.

// EndReason says why a subscription ended.
type EndReason string

// Why connections end.
const (
	EndClientClosed   EndReason = "client closed"
	EndReadError      EndReason = "read error"
	EndWriteError     EndReason = "write error"
	EndWriteTimeout   EndReason = "write timeout"
	EndConsumerSlow   EndReason = "ConsumerTooSlow"
	EndFutureCursor   EndReason = "FutureCursor"
	EndServerShutdown EndReason = "server shutdown"
	EndRateLimited    EndReason = "rate limited"
	EndOther          EndReason = "other"
)

// HealthConfig tunes consumer tracking. The zero value works.
type HealthConfig struct {
	// History is how many recent connections are kept per consumer (default 20).
	History int
	// StuckAfter is how many connections in a row at the same cursor make a
	// consumer stuck (default 3).
	StuckAfter int
	// Window bounds how far back those connections may go (default 10 min).
	Window time.Duration
	// MaxConsumers bounds memory: least recently seen consumers are
	// forgotten first (default 10,000).
	MaxConsumers int
	// MaxBytes bounds the table's memory as well (default 16 MiB),
	// estimated per consumer from its strings and the connections it
	// remembers; least recently seen consumers are forgotten first.
	MaxBytes int64
	// Logger receives stuck and recovery reports; nil is slog.Default().
	Logger *slog.Logger
	// Inspect describes the event at seq for the report (nil: seq only).
	Inspect func(ctx context.Context, seq int64) (*eventlog.EventInfo, error)
	// OnStuck is called once per incident (for metrics).
	OnStuck func(ConsumerReport)
}

// ConnRecord is one subscription, as the health tracker saw it.
type ConnRecord struct {
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// Cursor is the cursor the client asked for (nil: live only).
	Cursor  *int64    `json:"cursor,omitempty"`
	Frames  int64     `json:"frames"`
	LastSeq int64     `json:"lastSeq,omitempty"`
	Reason  EndReason `json:"reason,omitempty"`
}

// StuckInfo describes where a stuck consumer stalls.
type StuckInfo struct {
	// Cursor is the cursor it keeps asking for; Seq is the event it cannot
	// get past: the first event after the cursor that breaks a protocol
	// limit, up to the last one it was sent and the next; failing that,
	// the last one it was sent, or the one after the cursor. (A relay's
	// cursor can lag what it has processed: indigo's sends the seq before
	// the one it last finished, so the event after the cursor may be
	// sound.) LastSent is the highest seq written to it in those
	// connections.
	Cursor     int64               `json:"cursor"`
	Seq        int64               `json:"seq"`
	LastSent   int64               `json:"lastSent,omitempty"`
	Event      *eventlog.EventInfo `json:"event,omitempty"`
	Reconnects int                 `json:"reconnects"`
	Since      time.Time           `json:"since"`
}

// ConsumerReport is what the admin API shows of one consumer.
type ConsumerReport struct {
	IP          string       `json:"ip"`
	UserAgent   string       `json:"userAgent"`
	Connections int64        `json:"connections"`
	Refused     int64        `json:"refused"`
	Active      int          `json:"active"`
	LastSeen    time.Time    `json:"lastSeen"`
	Recent      []ConnRecord `json:"recent"`
	Stuck       *StuckInfo   `json:"stuck,omitempty"`
}

// Health tracks consumers. It is safe for concurrent use; the per-frame
// path (Conn.Sent) takes no lock.
type Health struct {
	cfg HealthConfig
	log *slog.Logger

	mu        sync.Mutex
	consumers map[consumerKey]*list.Element // of *consumer
	order     *list.List                    // front = most recently seen
	// byIP is, per address, the most recently seen consumer from it: the
	// one its refusals are counted on.
	byIP map[string]*list.Element
	// bytes is the estimated memory of the table (consumerCost summed).
	bytes int64
}

// MaxUserAgent is how much of a User-Agent the tracker keeps: enough for
// any relay's name and version, and a bound on what a client can make
// the server store (the header itself may be tens of kilobytes).
const MaxUserAgent = 256

// Memory estimates for HealthConfig.MaxBytes: a consumer's struct, its
// list element and map entries, and each connection it remembers.
const (
	consumerOverhead = 512
	connCost         = 192
)

// TruncateUserAgent cuts ua to at most MaxUserAgent bytes, on a UTF-8
// boundary.
func TruncateUserAgent(ua string) string {
	if len(ua) <= MaxUserAgent {
		return ua
	}
	return strings.ToValidUTF8(ua[:MaxUserAgent], "")
}

type consumerKey struct{ ip, ua string }

type consumer struct {
	key         consumerKey
	connections int64
	refused     int64
	active      int
	lastSeen    time.Time
	recent      []*Conn // oldest first
	stuck       *StuckInfo
	// headCursor/headAt remember that, when last checked, nothing followed
	// the cursor this consumer keeps asking for: it is at the head, not
	// stuck. Rechecked at most once a minute.
	headCursor int64
	headAt     time.Time
}

// NewHealth returns an empty tracker.
func NewHealth(cfg HealthConfig) *Health {
	if cfg.History <= 0 {
		cfg.History = 20
	}
	if cfg.StuckAfter <= 0 {
		cfg.StuckAfter = 3
	}
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Minute
	}
	if cfg.MaxConsumers <= 0 {
		cfg.MaxConsumers = 10_000
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 16 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Health{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "firehose-health"),
		consumers: map[consumerKey]*list.Element{},
		order:     list.New(),
		byIP:      map[string]*list.Element{},
	}
}

// Conn is one tracked subscription.
type Conn struct {
	h       *Health
	c       *consumer
	started time.Time
	cursor  *int64
	frames  atomic.Int64
	lastSeq atomic.Int64

	// Set once by End, under h.mu.
	ended  time.Time
	reason EndReason
}

// Start records a new subscription by ip/ua asking for cursor. ua is cut
// to MaxUserAgent bytes.
func (h *Health) Start(ip, ua string, cursor *int64) *Conn {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.touch(consumerKey{ip, TruncateUserAgent(ua)}, now)
	before := c.cost()
	c.connections++
	c.active++
	conn := &Conn{h: h, c: c, started: now}
	if cursor != nil {
		v := *cursor
		conn.cursor = &v
	}
	if len(c.recent) < h.cfg.History {
		c.recent = append(c.recent, conn)
	} else {
		// Shift in place: reslicing would keep the forgotten connections
		// reachable from the array until append next reallocates it.
		copy(c.recent, c.recent[1:])
		c.recent[len(c.recent)-1] = conn
	}
	h.bytes += c.cost() - before
	h.shrink()
	return conn
}

// Refused counts an upgrade from ip refused before it became a
// subscription. Refusals are counted per address, on the consumer last
// seen from it (or on an entry for the address alone): whatever a refused
// client sends besides its address is not kept.
func (h *Health) Refused(ip string) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if el, ok := h.byIP[ip]; ok {
		h.order.MoveToFront(el)
		c := el.Value.(*consumer)
		c.lastSeen = now
		c.refused++
		return
	}
	h.touch(consumerKey{ip: ip}, now).refused++
	h.shrink()
}

// touch finds or adds a consumer, marking it most recently seen. h.mu held.
func (h *Health) touch(k consumerKey, now time.Time) *consumer {
	if el, ok := h.consumers[k]; ok {
		h.order.MoveToFront(el)
		h.byIP[k.ip] = el
		c := el.Value.(*consumer)
		c.lastSeen = now
		return c
	}
	c := &consumer{key: k, lastSeen: now}
	el := h.order.PushFront(c)
	h.consumers[k] = el
	h.byIP[k.ip] = el
	h.bytes += c.cost()
	return c
}

// shrink forgets the least recently seen consumers while the table holds
// more than MaxConsumers or MaxBytes; the most recent one always stays.
// h.mu held.
func (h *Health) shrink() {
	for h.order.Len() > 1 && (len(h.consumers) > h.cfg.MaxConsumers || h.bytes > h.cfg.MaxBytes) {
		old := h.order.Back()
		c := old.Value.(*consumer)
		h.order.Remove(old)
		delete(h.consumers, c.key)
		if h.byIP[c.key.ip] == old {
			delete(h.byIP, c.key.ip)
		}
		h.bytes -= c.cost()
	}
}

// cost estimates a consumer's memory, for HealthConfig.MaxBytes.
func (c *consumer) cost() int64 {
	return consumerOverhead + int64(len(c.key.ip)+len(c.key.ua)) + connCost*int64(len(c.recent))
}

// Bytes is the table's estimated memory (for tests and metrics).
func (h *Health) Bytes() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bytes
}

// Sent records that the frame of seq went out. Lock-free: it runs per frame.
func (c *Conn) Sent(seq int64) {
	c.frames.Add(1)
	if seq > 0 {
		c.lastSeq.Store(seq)
	}
}

// End records why the subscription ended and checks whether the consumer is
// now stuck. Only the first call counts.
func (c *Conn) End(reason EndReason) {
	h := c.h
	h.mu.Lock()
	if !c.ended.IsZero() {
		h.mu.Unlock()
		return
	}
	c.ended, c.reason = time.Now(), reason
	c.c.active--
	report, fresh := h.checkStuck(c.c)
	h.mu.Unlock()
	if fresh {
		go h.announce(report)
	}
}

// checkStuck flags the consumer when its last StuckAfter ended connections,
// all within Window, asked for the same cursor and were sent something: a
// consumer that keeps coming back for the same place is not getting past
// the event there, whatever we wrote to its socket. It returns the report
// and whether the incident is new. h.mu held.
func (h *Health) checkStuck(c *consumer) (ConsumerReport, bool) {
	var ended []*Conn
	for i := len(c.recent) - 1; i >= 0 && len(ended) < h.cfg.StuckAfter; i-- {
		if !c.recent[i].ended.IsZero() {
			ended = append(ended, c.recent[i])
		}
	}
	if len(ended) == 0 {
		return ConsumerReport{}, false
	}
	last := ended[0]
	if last.cursor == nil || (c.stuck != nil && *last.cursor != c.stuck.Cursor) {
		if c.stuck != nil {
			h.log.Info("firehose consumer recovered", "ip", c.key.ip, "user_agent", c.key.ua, "was_stuck_at", c.stuck.Seq)
		}
		c.stuck = nil
		return ConsumerReport{}, false
	}
	if c.stuck != nil {
		c.stuck.Reconnects++
		return ConsumerReport{}, false
	}
	if len(ended) < h.cfg.StuckAfter {
		return ConsumerReport{}, false
	}
	cutoff := time.Now().Add(-h.cfg.Window)
	sent := false
	var lastSent int64
	for _, e := range ended {
		if e.cursor == nil || *e.cursor != *last.cursor || e.started.Before(cutoff) {
			return ConsumerReport{}, false
		}
		sent = sent || e.frames.Load() > 0
		lastSent = max(lastSent, e.lastSeq.Load())
	}
	// A consumer at the head that reconnects is not stuck: something must
	// follow its cursor. A frame written says so; otherwise (the write of an
	// oversized frame fails when the client drops it) Inspect decides, in
	// announce.
	if !sent && (h.cfg.Inspect == nil || (c.headCursor == *last.cursor && time.Since(c.headAt) < time.Minute)) {
		return ConsumerReport{}, false
	}
	c.stuck = &StuckInfo{Cursor: *last.cursor, Seq: *last.cursor + 1, LastSent: lastSent, Reconnects: len(ended), Since: ended[len(ended)-1].started}
	return h.report(c), true
}

// announce fills in the event and warns, once per incident.
func (h *Health) announce(r ConsumerReport) {
	if h.cfg.Inspect != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ev, err := h.locate(ctx, r.Stuck)
		if err == nil && ev == nil {
			// Nothing follows the cursor: at the head, not stuck.
			h.mu.Lock()
			if el, ok := h.consumers[consumerKey{r.IP, r.UserAgent}]; ok {
				if c := el.Value.(*consumer); c.stuck != nil && c.stuck.Cursor == r.Stuck.Cursor {
					c.stuck, c.headCursor, c.headAt = nil, r.Stuck.Cursor, time.Now()
				}
			}
			h.mu.Unlock()
			return
		}
		if err == nil {
			h.mu.Lock()
			if el, ok := h.consumers[consumerKey{r.IP, r.UserAgent}]; ok {
				if c := el.Value.(*consumer); c.stuck != nil && c.stuck.Cursor == r.Stuck.Cursor {
					c.stuck.Seq, c.stuck.Event = ev.Seq, ev
				}
			}
			h.mu.Unlock()
			r.Stuck.Seq, r.Stuck.Event = ev.Seq, ev
		}
	}
	attrs := []any{"ip", r.IP, "user_agent", r.UserAgent, "cursor", r.Stuck.Cursor, "seq", r.Stuck.Seq, "reconnects", r.Stuck.Reconnects}
	if ev := r.Stuck.Event; ev != nil {
		attrs = append(attrs, "kind", ev.Kind, "did", ev.DID, "frame_bytes", ev.FrameBytes, "blocks_bytes", ev.BlocksBytes, "ops", ev.Ops)
		if len(ev.Problems) > 0 {
			attrs = append(attrs, "breaks_limits", ev.Problems)
		}
	}
	h.log.Warn("firehose consumer is stuck: it keeps reconnecting at the same cursor and never gets past the next event; inspect it with `bulwark admin firehose events --from SEQ` and repair with `bulwark admin firehose rewrite-as-sync --seq SEQ`", attrs...)
	if h.cfg.OnStuck != nil {
		h.cfg.OnStuck(r)
	}
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

// report copies a consumer's state. h.mu held.
func (h *Health) report(c *consumer) ConsumerReport {
	r := ConsumerReport{
		IP: c.key.ip, UserAgent: c.key.ua, Connections: c.connections, Refused: c.refused,
		Active: c.active, LastSeen: c.lastSeen, Recent: make([]ConnRecord, 0, len(c.recent)),
	}
	for _, conn := range c.recent {
		r.Recent = append(r.Recent, ConnRecord{
			Started: conn.started, Ended: conn.ended, Cursor: conn.cursor,
			Frames: conn.frames.Load(), LastSeq: conn.lastSeq.Load(), Reason: conn.reason,
		})
	}
	if c.stuck != nil {
		s := *c.stuck
		r.Stuck = &s
	}
	return r
}

// Consumers reports every tracked consumer, stuck ones first, then most
// recently seen.
func (h *Health) Consumers() []ConsumerReport {
	h.mu.Lock()
	out := make([]ConsumerReport, 0, len(h.consumers))
	for el := h.order.Front(); el != nil; el = el.Next() {
		out = append(out, h.report(el.Value.(*consumer)))
	}
	h.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Stuck != nil && out[j].Stuck == nil })
	return out
}

// StuckCount is how many consumers are stuck now (for metrics).
func (h *Health) StuckCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, el := range h.consumers {
		if el.Value.(*consumer).stuck != nil {
			n++
		}
	}
	return n
}
