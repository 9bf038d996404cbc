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

	"golang.org/x/time/rate"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// Consumer health: the firehose remembers, per consumer (client IP plus
// user agent, cut to MaxUserAgent bytes), its recent connections, and
// refusals per address. From them it tells the operator, once per
// incident and with counts, of three things:
//
//   - a consumer whose connections keep failing (the client dropping a
//     frame it cannot take, resetting the connection mid-write): one
//     warning when it starts, one line with the count when it ends
//     (incident.go);
//   - a consumer stuck: reconnecting at the same cursor without getting
//     past the event after it (too big for it, or one it cannot verify).
//     Its next reconnections are held without any database work until that
//     event is repaired, instead of being served the same event again
//     (stuck.go);
//   - a consumer asking for a cursor beyond our newest event (FutureCursor),
//     as after restoring a backup: one warning naming the raise-seq command
//     that lets it back in (incident.go).
//
// The admin API, the console and metrics show the same state.

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
	// EndRefusedFrame: the client closed with 1009 (message too big): it
	// refused a frame over its read limit.
	EndRefusedFrame EndReason = "client refused a frame"
	// EndClientError: the client closed with another protocol error code.
	EndClientError EndReason = "client error"
	EndOther       EndReason = "other"
)

// failed says whether a connection that ended for r failed: the client
// dropped it mid-stream or refused what it was sent, or the server gave
// up on it. A client that closes or goes away is not a failure.
func (r EndReason) failed() bool {
	switch r {
	case EndReadError, EndWriteError, EndWriteTimeout, EndConsumerSlow, EndRefusedFrame, EndClientError:
		return true
	}
	return false
}

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
	// ParkFor bounds how long a stuck consumer's reconnection at the
	// cursor it is stuck at is held before it is served again, when the
	// event it is stuck on breaks no protocol limit (default 1 min): the
	// consumer may get past it on its own. One over a limit cannot be
	// passed until it is repaired, so it is held ten times as long.
	ParkFor time.Duration
	// RepairPoll is how often the events consumers are stuck on are read
	// again to notice a repair, made by this process or another (default
	// 1 s). Nothing is read while no consumer is stuck.
	RepairPoll time.Duration
	// Logger receives the incident reports; nil is slog.Default().
	Logger *slog.Logger
	// Inspect describes the first event at or after seq for the report
	// (nil: seq only, no holding, no repair noticed).
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
	// Held is how many of its connections are being held until the event
	// is repaired (see HealthConfig.ParkFor).
	Held int `json:"held,omitempty"`
	// Command is the bulwark admin command that repairs the event.
	Command string `json:"command"`
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
	// Failing is the run of failed connections going on, if any.
	Failing *FailureInfo `json:"failing,omitempty"`
	// FutureCursor is set while the consumer asks for a cursor beyond our
	// newest event.
	FutureCursor *FutureCursorInfo `json:"futureCursor,omitempty"`
}

// Health tracks consumers. It is safe for concurrent use; the per-frame
// path (Conn.Sent) takes no lock. Run drives what is time-based: noticing
// repairs and the end of incidents.
type Health struct {
	cfg HealthConfig
	log *slog.Logger
	// admission, when set, forgets the refusals of consumers whose event
	// was repaired (UseAdmission).
	admission atomic.Pointer[Admission]

	mu        sync.Mutex
	consumers map[consumerKey]*list.Element // of *consumer
	order     *list.List                    // front = most recently seen
	// byIP is, per address, the most recently seen consumer from it: the
	// one its refusals are counted on.
	byIP map[string]*list.Element
	// bytes is the estimated memory of the table (consumerCost summed).
	bytes int64
	// open holds the consumers with an incident going on (stuck, failing
	// or ahead), which Run looks at.
	open map[*consumer]struct{}
	// warnings limits incident warnings across consumers; warningsHeld
	// counts those not logged since the last one (allowWarning).
	warnings     *rate.Limiter
	warningsHeld int64
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
	// release is closed when the stuck incident ends: the connections
	// held meanwhile are then served. holdable says the connections that
	// made it stuck failed (rather than closing cleanly): only then is
	// serving the same event again futile.
	release  chan struct{}
	holdable bool
	// headCursor/headAt remember that, when last checked, nothing followed
	// the cursor this consumer keeps asking for: it is at the head, not
	// stuck. Rechecked at most once a minute.
	headCursor int64
	headAt     time.Time
	failing    *failureRun
	future     *FutureCursorInfo
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
	if cfg.ParkFor <= 0 {
		cfg.ParkFor = time.Minute
	}
	if cfg.RepairPoll <= 0 {
		cfg.RepairPoll = time.Second
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
		open:      map[*consumer]struct{}{},
		warnings:  rate.NewLimiter(warnRate, warnBurst),
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

	// Set under h.mu: hold, while the connection is held (stuck.go);
	// ended and reason once, by End.
	hold    bool
	holdFor *StuckInfo
	// serving is when it began to be served: its start, or the end of
	// its hold.
	serving time.Time
	// done is closed by End.
	done   chan struct{}
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
	conn := &Conn{h: h, c: c, started: now, serving: now, done: make(chan struct{})}
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
		// Connections held for it must not wait for a repair nobody
		// will report to them.
		h.endStuck(c)
		delete(h.open, c)
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
func (c *Conn) End(reason EndReason) { c.EndErr(reason, nil) }

// EndErr is End with the error the subscription ended on, for the warning
// that opens a run of failures.
func (c *Conn) EndErr(reason EndReason, err error) {
	h := c.h
	h.mu.Lock()
	if !c.ended.IsZero() {
		h.mu.Unlock()
		return
	}
	now := time.Now()
	c.ended, c.reason = now, reason
	close(c.done)
	c.c.active--
	c.unhold()
	var logs []logLine
	logs = h.noteEnd(c, err, now, logs)
	report, fresh, logs := h.checkStuck(c.c, logs)
	h.mu.Unlock()
	h.emit(logs)
	if fresh {
		go h.announce(report)
	}
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
	if c.failing != nil {
		f := c.failing.FailureInfo
		r.Failing = &f
	}
	if c.future != nil {
		f := *c.future
		r.FutureCursor = &f
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
