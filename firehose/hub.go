package firehose

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/priority"
)

// Config tunes a Hub. The zero value works.
type Config struct {
	// Retention is the replay window (default eventlog.DefaultRetention).
	// Older cursors get #info OutdatedCursor and the whole window.
	Retention time.Duration
	// PageEvents and PageBytes bound one backfill read (default 100
	// events, 1 MiB of bodies, always at least one event). A page is read
	// only after the previous one went out, so they bound what a backfilling
	// subscriber holds in memory.
	PageEvents int
	PageBytes  int
	// QueueFrames and QueueBytes bound the live frames waiting for one
	// subscriber (default 2000 frames, 32 MiB). Frames are shared between
	// subscribers, so this is what a stalled one can pin, not copy.
	QueueFrames int
	QueueBytes  int
	// WriteTimeout bounds writing one frame (default 30s).
	WriteTimeout time.Duration
	// PingInterval is how often subscribers are pinged (default 30s);
	// one that sends nothing, not even a pong, for PongTimeout (default
	// 3 × PingInterval) is closed.
	PingInterval time.Duration
	PongTimeout  time.Duration
	// PollInterval is how often the hub looks for new events when no
	// wake-up arrives (default 1s): a safety net for a lost notification.
	PollInterval time.Duration
	// DisableOversizeSync sends events over the relay limits as stored
	// instead of as #sync. Only for reproducing incidents and testing
	// repairs: relays drop such frames, or the whole connection.
	DisableOversizeSync bool
	// Health, when set, tracks consumers: each subscription's cursor,
	// frames and why it ended, to spot one stuck on an event.
	Health *Health
	// Budget, when set, is the shared in-flight byte budget each backfill
	// page is held against while it is being sent. Live frames are shared
	// by all subscribers and not counted.
	Budget *budget.Budget
	// Priority, when set, is the server's writes-first gate: a backfilling
	// subscriber yields to writes in flight before reading each page.
	Priority *priority.Gate
	// Sessions, when set, is a pool reaching Postgres directly (not
	// through a transaction-mode pooler), for the LISTEN session that
	// wakes the hub when another node sequences. Default: the hub's pool.
	Sessions *pgxpool.Pool
	// Logger receives the hub's logs (default slog.Default()).
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Retention <= 0 {
		c.Retention = eventlog.DefaultRetention
	}
	if c.PageEvents <= 0 {
		c.PageEvents = 100
	}
	if c.PageBytes <= 0 {
		c.PageBytes = 1 << 20
	}
	if c.QueueFrames <= 0 {
		c.QueueFrames = 2000
	}
	if c.QueueBytes <= 0 {
		c.QueueBytes = 32 << 20
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.PingInterval <= 0 {
		c.PingInterval = 30 * time.Second
	}
	if c.PongTimeout <= 0 {
		c.PongTimeout = 3 * c.PingInterval
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// liveBatchEvents and liveBatchBytes bound one read of new events by the
// hub (for all subscribers at once).
const (
	liveBatchEvents = 500
	liveBatchBytes  = 8 << 20
)

// Hub serves com.atproto.sync.subscribeRepos for one process. It reads each
// new event once, encodes its frame once and hands the same bytes to every
// live subscriber; backfill is read per subscriber, a page at a time, at the
// pace the subscriber's socket takes it.
type Hub struct {
	log    *eventlog.Log
	cfg    Config
	logger *slog.Logger

	wake      chan struct{}
	ready     chan struct{}
	readyOnce sync.Once

	mu     sync.Mutex
	last   int64 // highest seq handed to live subscribers
	live   map[*liveQueue]struct{}
	subs   map[*subscription]struct{}
	closed bool
}

// NewHub returns a hub over pool's event log. Call Run to start it.
func NewHub(pool *pgxpool.Pool, cfg Config) *Hub {
	cfg.defaults()
	log := eventlog.NewLog(pool)
	log.UseSessions(cfg.Sessions)
	return &Hub{
		log:    log,
		cfg:    cfg,
		logger: cfg.Logger.With("component", "firehose"),
		wake:   make(chan struct{}, 1),
		ready:  make(chan struct{}),
		live:   map[*liveQueue]struct{}{},
		subs:   map[*subscription]struct{}{},
	}
}

// UseBudget makes backfill pages draw from b (see Config.Budget), for
// servers that build the budget after the hub. Call it before Run.
func (h *Hub) UseBudget(b *budget.Budget) {
	h.cfg.Budget = b
}

// UsePriority makes backfill yield to gate's foreground work (writes)
// before each page, for servers that build the gate after the hub. Call it
// before Run.
func (h *Hub) UsePriority(gate *priority.Gate) {
	h.cfg.Priority = gate
}

// Notify tells the hub that events up to lastSeq were sequenced. It never
// blocks; register it with Sequencer.OnSequenced.
func (h *Hub) Notify(lastSeq int64) {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Run delivers new events to live subscribers until ctx ends, then closes
// every subscription. It wakes on Notify, on NOTIFY from other processes'
// sequencers, and every PollInterval. It also runs consumer health's
// background checks (Health.Run).
func (h *Hub) Run(ctx context.Context) error {
	for {
		last, err := h.log.LastSeq(ctx)
		if err == nil {
			h.mu.Lock()
			h.last = last
			h.mu.Unlock()
			break
		}
		h.logger.Warn("reading last seq; retrying", "err", err)
		select {
		case <-ctx.Done():
			h.Close()
			return nil
		case <-time.After(time.Second):
		}
	}
	h.readyOnce.Do(func() { close(h.ready) })
	defer h.Close()

	if h.cfg.Health != nil {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { _ = h.cfg.Health.Run(ctx) })
	}
	go h.listen(ctx)
	tick := time.NewTicker(h.cfg.PollInterval)
	defer tick.Stop()
	for {
		if err := h.deliver(ctx); err != nil && ctx.Err() == nil {
			h.logger.Warn("reading new events", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-h.wake:
		case <-tick.C:
		}
	}
}

// listen wakes the hub on every NOTIFY from a sequencer in any process,
// over a connection of its own (a LISTEN needs one subscription for good).
func (h *Hub) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := h.log.WatchSequenced(ctx, func() { h.Notify(0) })
		if ctx.Err() != nil {
			return
		}
		h.logger.Warn("listening for sequenced events; reconnecting", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// deliver reads every event after h.last and fans it out. With nobody
// listening it only moves h.last to the sequencer's high-water mark: a
// subscriber that joins later reads what it needs up to there itself.
func (h *Hub) deliver(ctx context.Context) error {
	h.mu.Lock()
	idle := len(h.live) == 0
	h.mu.Unlock()
	if idle {
		last, err := h.log.LastSeq(ctx)
		if err != nil {
			return err
		}
		h.mu.Lock()
		idle = len(h.live) == 0
		if idle {
			h.last = max(h.last, last)
		}
		h.mu.Unlock()
		if idle {
			return nil
		}
	}
	for {
		h.mu.Lock()
		after := h.last
		h.mu.Unlock()
		evs, err := h.after(ctx, after, liveBatchEvents, liveBatchBytes)
		if err != nil || len(evs) == 0 {
			return err
		}
		frames := make([]liveFrame, 0, len(evs))
		for i := range evs {
			data, kind, err := h.frame(&evs[i], nil, slog.LevelWarn)
			if err != nil {
				continue
			}
			frames = append(frames, liveFrame{seq: evs[i].Seq, kind: kind, data: data})
		}
		h.mu.Lock()
		for s := range h.live {
			if !s.push(frames, h.cfg.QueueFrames, h.cfg.QueueBytes) {
				delete(h.live, s)
			}
		}
		h.last = evs[len(evs)-1].Seq
		h.mu.Unlock()
	}
}

// after reads a bounded page of events with seq > after.
func (h *Hub) after(ctx context.Context, after int64, limit, maxBytes int) ([]eventlog.Event, error) {
	return h.log.Page(ctx, after, limit, maxBytes)
}

// frame encodes ev's wire frame, appending to dst, and says which kind of
// frame it is; an oversized event becomes #sync. An error means the event cannot be sent at all (it is
// logged and skipped: never sent oversized). The replacement is logged at
// level: a warning when it goes live (once per event), debug on backfill,
// where every reconnecting consumer would log it again.
func (h *Hub) frame(ev *eventlog.Event, dst []byte, level slog.Level) ([]byte, string, error) {
	if !eventlog.Oversized(ev) || h.cfg.DisableOversizeSync {
		return eventlog.AppendFrame(dst, ev.Kind, ev.Body, ev.SeqOffset, ev.Seq), string(ev.Kind), nil
	}
	data, err := eventlog.SyncFrame(ev)
	if err != nil {
		h.logger.Error("oversized event cannot be sent as #sync; skipping it",
			"seq", ev.Seq, "did", ev.DID, "kind", ev.Kind, "frame_bytes", ev.FrameSize(), "err", err)
		return nil, "", err
	}
	h.logger.Log(context.Background(), level, "oversized event sent as #sync", "seq", ev.Seq, "did", ev.DID,
		"kind", ev.Kind, "frame_bytes", ev.FrameSize(), "blocks_bytes", ev.BlocksLen, "ops", ev.OpsCount)
	return data, string(eventlog.KindSync), nil
}

// Close ends every subscription and refuses new ones. Run calls it when its
// context ends; servers call it on shutdown, since hijacked connections are
// not closed by http.Server.Shutdown.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	ss := make([]*subscription, 0, len(h.subs))
	for s := range h.subs {
		ss = append(ss, s)
	}
	h.mu.Unlock()
	for _, s := range ss {
		s.cancel()
	}
}

// Subscribers returns the number of subscriptions being served.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Live returns the number of subscriptions past their backfill, receiving
// new events as they are sequenced.
func (h *Hub) Live() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.live)
}

// register adds a subscription's live queue; it receives every event after the
// returned seq.
func (h *Hub) register(s *liveQueue) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.live[s] = struct{}{}
	return h.last
}

func (h *Hub) unregister(s *liveQueue) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.live, s)
}

// lastDelivered is the highest seq handed to live subscribers.
// Delivered is the seq of the last event the hub has handed to its live
// subscribers: a subscription that has caught up to it joins the live
// fan-out instead of reading further pages.
func (h *Hub) Delivered() int64 { return h.lastDelivered() }

func (h *Hub) lastDelivered() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// Client identifies a subscriber for consumer health.
type Client struct {
	// IP is the client's address (as the admission control saw it).
	IP string
	// UserAgent is the User-Agent header; relays name themselves there.
	// Consumer health keeps at most MaxUserAgent bytes of it.
	UserAgent string
}

// Refused records a subscription from ip refused before the upgrade
// (consumer health counts them per address; nothing else is done).
func (h *Hub) Refused(ip string) {
	if h.cfg.Health != nil {
		h.cfg.Health.Refused(ip)
	}
}

// Health returns the consumer tracker, or nil (for admin APIs).
func (h *Hub) Health() *Health { return h.cfg.Health }
