package firehose

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/gorilla/websocket"
	"github.com/jackc/pgx/v5/pgxpool"
	cbg "github.com/whyrusleeping/cbor-gen"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/priority"
)

// Error-frame names of com.atproto.sync.subscribeRepos.
const (
	ErrNameFutureCursor    = "FutureCursor"
	ErrNameConsumerTooSlow = "ConsumerTooSlow"
	// InfoOutdatedCursor is the #info name sent before replaying the whole
	// window to a cursor older than it.
	InfoOutdatedCursor = "OutdatedCursor"
)

const outdatedMessage = "cursor is older than the replay window; replaying the whole window"

// Config tunes a Hub. The zero value works.
type Config struct {
	// Retention is the replay window (default eventlog.DefaultRetention). Older
	// cursors get #info OutdatedCursor and the whole window.
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
	Logger   *slog.Logger
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
	pool   *pgxpool.Pool
	log    *eventlog.Log
	cfg    Config
	logger *slog.Logger

	wake      chan struct{}
	ready     chan struct{}
	readyOnce sync.Once

	mu       sync.Mutex
	last     int64 // highest seq handed to live subscribers
	live     map[*subscriber]struct{}
	sessions map[*session]struct{}
	closed   bool
}

// NewHub returns a hub over pool's event log. Call Run to start it.
func NewHub(pool *pgxpool.Pool, cfg Config) *Hub {
	cfg.defaults()
	return &Hub{
		pool:     pool,
		log:      eventlog.NewLog(pool),
		cfg:      cfg,
		logger:   cfg.Logger.With("component", "firehose"),
		wake:     make(chan struct{}, 1),
		ready:    make(chan struct{}),
		live:     map[*subscriber]struct{}{},
		sessions: map[*session]struct{}{},
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
// sequencers, and every PollInterval.
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
// over a connection of its own (a LISTEN needs one session for good).
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
			data, err := h.frame(&evs[i], nil, slog.LevelWarn)
			if err != nil {
				continue
			}
			frames = append(frames, liveFrame{seq: evs[i].Seq, data: data})
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

// frame encodes ev's wire frame, appending to dst; an oversized event
// becomes #sync. An error means the event cannot be sent at all (it is
// logged and skipped: never sent oversized). The replacement is logged at
// level: a warning when it goes live (once per event), debug on backfill,
// where every reconnecting consumer would log it again.
func (h *Hub) frame(ev *eventlog.Event, dst []byte, level slog.Level) ([]byte, error) {
	if !eventlog.Oversized(ev) || h.cfg.DisableOversizeSync {
		return eventlog.AppendFrame(dst, ev.Kind, ev.Body, ev.SeqOffset, ev.Seq), nil
	}
	data, err := eventlog.SyncFrame(ev)
	if err != nil {
		h.logger.Error("oversized event cannot be sent as #sync; skipping it",
			"seq", ev.Seq, "did", ev.DID, "kind", ev.Kind, "frame_bytes", ev.FrameSize(), "err", err)
		return nil, err
	}
	h.logger.Log(context.Background(), level, "oversized event sent as #sync", "seq", ev.Seq, "did", ev.DID,
		"kind", ev.Kind, "frame_bytes", ev.FrameSize(), "blocks_bytes", ev.BlocksLen, "ops", ev.OpsCount)
	return data, nil
}

// Close ends every subscription and refuses new ones. Run calls it when its
// context ends; servers call it on shutdown, since hijacked connections are
// not closed by http.Server.Shutdown.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	ss := make([]*session, 0, len(h.sessions))
	for s := range h.sessions {
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
	return len(h.sessions)
}

// Live returns the number of subscriptions past their backfill, receiving
// new events as they are sequenced.
func (h *Hub) Live() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.live)
}

// liveFrame is one encoded event, shared by every subscriber's queue.
type liveFrame struct {
	seq  int64
	data []byte
}

// subscriber is the live queue of one subscription.
type subscriber struct {
	signal chan struct{}

	mu      sync.Mutex
	q       []liveFrame
	qBytes  int
	tooSlow bool
}

// push queues frames, or marks the subscriber too slow (and returns false)
// when they do not fit.
func (s *subscriber) push(frames []liveFrame, maxFrames, maxBytes int) bool {
	n := 0
	for _, f := range frames {
		n += len(f.data)
	}
	s.mu.Lock()
	ok := !s.tooSlow && len(s.q)+len(frames) <= maxFrames && s.qBytes+n <= maxBytes
	if ok {
		s.q = append(s.q, frames...)
		s.qBytes += n
	} else {
		s.tooSlow = true
		// Let go of the frames at once: a stalled subscriber must not pin
		// them until its write deadline.
		s.q, s.qBytes = nil, 0
	}
	s.mu.Unlock()
	select {
	case s.signal <- struct{}{}:
	default:
	}
	return ok
}

// take swaps the queue for spare (an emptied earlier queue, reused).
func (s *subscriber) take(spare []liveFrame) ([]liveFrame, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	s.q, s.qBytes = spare[:0], 0
	return q, s.tooSlow
}

// register adds a live subscriber; it receives every event after the
// returned seq.
func (h *Hub) register(s *subscriber) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.live[s] = struct{}{}
	return h.last
}

func (h *Hub) unregister(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.live, s)
}

// lastDelivered is the highest seq handed to live subscribers.
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
	UserAgent string
}

// Refused records a subscription refused before the upgrade (consumer
// health counts them; nothing else is done).
func (h *Hub) Refused(c Client) {
	if h.cfg.Health != nil {
		h.cfg.Health.Refused(c.IP, c.UserAgent)
	}
}

// Health returns the consumer tracker, or nil (for admin APIs).
func (h *Hub) Health() *Health { return h.cfg.Health }

// session is one subscription being served.
type session struct {
	h      *Hub
	conn   *websocket.Conn
	cancel context.CancelFunc
	logger *slog.Logger
	track  *Conn // nil without consumer health
	cur    int64 // last seq written
	buf    []byte
	ping   time.Time

	// Only the session's own goroutine writes to conn, so that live frames
	// can go out in batches straight to the socket (see writeFrames). The
	// read loop hands pings it must answer over ctl.
	ctl    chan struct{}
	pongMu sync.Mutex
	pong   *string
	hdrs   []byte
	bufs   net.Buffers
}

// errClosed is a subscription ended by the hub (shutdown).
var errClosed = errors.New("firehose closed")

// Upgrader returns the WebSocket upgrader subscriptions use: small buffers
// (an idle subscriber holds none while not writing) and any origin (the
// stream is public).
func Upgrader() *websocket.Upgrader {
	return &websocket.Upgrader{
		ReadBufferSize:  512,
		WriteBufferSize: 16 << 10,
		WriteBufferPool: writeBufferPool,
		CheckOrigin:     func(*http.Request) bool { return true },
	}
}

var writeBufferPool = &sync.Pool{}

// Serve runs one subscription on an upgraded connection until the client
// goes away, ctx ends or the hub closes, and closes conn. cursor nil means
// live only. It returns why the subscription ended (nil for a client that
// disconnected).
func (h *Hub) Serve(ctx context.Context, conn *websocket.Conn, cursor *int64, client Client) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer conn.Close()
	s := &session{h: h, conn: conn, cancel: cancel, logger: h.logger, ctl: make(chan struct{}, 1)}
	if cursor != nil {
		s.logger = s.logger.With("cursor", *cursor)
	}
	if h.cfg.Health != nil {
		s.track = h.cfg.Health.Start(client.IP, client.UserAgent, cursor)
		// Whatever ended it first has said why; this is the fallback.
		defer s.end(EndOther)
	}

	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		s.end(EndServerShutdown)
		s.close(websocket.CloseGoingAway, "server shutting down")
		return errClosed
	}
	h.sessions[s] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.sessions, s)
		h.mu.Unlock()
	}()

	go s.readLoop()
	var err error
	select {
	case <-h.ready:
		err = s.run(ctx, cursor)
	case <-ctx.Done():
	}
	if ctx.Err() != nil {
		h.mu.Lock()
		closed := h.closed
		h.mu.Unlock()
		if closed {
			s.end(EndServerShutdown)
			s.close(websocket.CloseGoingAway, "server shutting down")
		}
		// The client left (or the server is stopping): not an error.
		return nil
	}
	if err != nil {
		s.end(endReasonFor(err))
	}
	return err
}

// end records why the subscription ended, for consumer health; the first
// reason recorded stands.
func (s *session) end(r EndReason) {
	if s.track != nil {
		s.track.End(r)
	}
}

// sent records a frame written, for consumer health.
func (s *session) sent(seq int64) {
	if s.track != nil {
		s.track.Sent(seq)
	}
}

// endReasonFor classifies the error a session ended on.
func endReasonFor(err error) EndReason {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return EndWriteTimeout
	case errors.Is(err, net.ErrClosed), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, websocket.ErrCloseSent):
		return EndWriteError
	}
	return EndOther
}

// readLoop consumes what the client sends (pongs, pings, close) and
// cancels the session when the connection ends or stays silent past
// PongTimeout.
func (s *session) readLoop() {
	defer s.cancel()
	timeout := s.h.cfg.PongTimeout
	c := s.conn
	c.SetReadLimit(4096)
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	c.SetPongHandler(func(string) error {
		return c.SetReadDeadline(time.Now().Add(timeout))
	})
	// The default handlers would write from this goroutine; the writer
	// answers instead (pings), or the connection just ends (close).
	c.SetPingHandler(func(data string) error {
		s.pongMu.Lock()
		s.pong = &data
		s.pongMu.Unlock()
		select {
		case s.ctl <- struct{}{}:
		default:
		}
		return nil
	})
	c.SetCloseHandler(func(int, string) error { return nil })
	for {
		_, r, err := c.NextReader()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				s.end(EndReadError) // silent past PongTimeout
			} else {
				s.end(EndClientClosed)
			}
			return
		}
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		if _, err := io.Copy(io.Discard, r); err != nil {
			return
		}
	}
}

func (s *session) run(ctx context.Context, cursor *int64) error {
	h := s.h
	sub := &subscriber{signal: make(chan struct{}, 1)}
	defer h.unregister(sub)
	s.ping = time.Now()

	if cursor == nil {
		s.cur = h.register(sub)
		return s.liveLoop(ctx, sub)
	}
	from, err := s.resolve(ctx, *cursor)
	if err != nil || from < 0 {
		return err
	}
	s.cur = from
	// Catch up through pages until the log is (nearly) exhausted, then
	// join the live fan-out, then read the few events sequenced in between:
	// everything after start comes through the queue, so nothing is missed
	// and, filtering by seq, nothing is sent twice.
	if err := s.backfill(ctx, func() bool { return s.cur >= h.lastDelivered() }, 0); err != nil {
		return err
	}
	start := h.register(sub)
	if err := s.backfill(ctx, nil, start); err != nil {
		return err
	}
	return s.liveLoop(ctx, sub)
}

// resolve turns a cursor into the seq to replay after, reading only seqs
// and creation times. A negative result means the session is over (an
// error frame was sent).
func (s *session) resolve(ctx context.Context, cursor int64) (int64, error) {
	h := s.h
	last, err := h.log.LastSeq(ctx)
	if err != nil {
		return -1, err
	}
	if cursor > last {
		s.logger.Debug("future cursor", "last_seq", last)
		return -1, s.fail(ErrNameFutureCursor, "cursor is beyond the latest event")
	}
	windowStart := time.Now().Add(-h.cfg.Retention)
	if cursor > 0 {
		got, at, err := h.log.CursorPoint(ctx, cursor)
		if errors.Is(err, eventlog.ErrNoEvent) {
			if cursor < last {
				// Everything after the cursor was pruned: the window is
				// empty, so the stream goes on live from the end.
				if err := s.write(infoFrame(InfoOutdatedCursor, outdatedMessage)); err != nil {
					return -1, err
				}
				return last, nil
			}
			return cursor, nil
		}
		if err != nil {
			return -1, err
		}
		outdated := at.Before(windowStart)
		if !outdated && got != cursor {
			// The cursor's own event is gone. Seqs have no gaps but what
			// pruning leaves (and a RaiseSeq jump), so a cursor below the
			// oldest event left is one the window has moved past.
			oldest, err := h.log.OldestSeq(ctx)
			if err != nil {
				return -1, err
			}
			outdated = cursor < oldest
		}
		if !outdated {
			return cursor, nil
		}
		if err := s.write(infoFrame(InfoOutdatedCursor, outdatedMessage)); err != nil {
			return -1, err
		}
	}
	first, err := h.log.FirstSeqSince(ctx, windowStart)
	if errors.Is(err, eventlog.ErrNoEvent) {
		return last, nil
	}
	if err != nil {
		return -1, err
	}
	return first - 1, nil
}

// backfill writes events after s.cur, a page at a time, until a page comes
// back empty, done reports true after a page, or (with until > 0) it has
// written everything up to until.
func (s *session) backfill(ctx context.Context, done func() bool, until int64) error {
	h := s.h
	for {
		if until > 0 && s.cur >= until {
			return nil
		}
		// Backfill is background work: a page waits for writes in flight.
		if err := h.cfg.Priority.Yield(ctx); err != nil {
			return err
		}
		res, err := h.reserve(ctx)
		if err != nil {
			return err
		}
		page, err := h.after(ctx, s.cur, h.cfg.PageEvents, h.cfg.PageBytes)
		if err != nil {
			res.Release()
			return err
		}
		if len(page) == 0 {
			res.Release()
			return nil
		}
		res.Resize(pageBytes(page))
		err = s.sendPage(ctx, page, until)
		res.Release()
		if err != nil {
			if errors.Is(err, errPageDone) {
				return nil
			}
			return err
		}
		if done != nil && done() {
			return nil
		}
	}
}

// errPageDone stops a backfill that reached its upper bound mid-page.
var errPageDone = errors.New("backfill reached its bound")

// pageBytes is the memory a page of events holds.
func pageBytes(page []eventlog.Event) int64 {
	var n int64
	for i := range page {
		n += int64(len(page[i].Body))
	}
	return n
}

// reserve holds a page's worth of the shared in-flight byte budget. A full
// wait queue pauses the backfill instead of ending it: the subscriber
// loses nothing by waiting.
func (h *Hub) reserve(ctx context.Context) (*budget.Reservation, error) {
	for {
		res, err := h.cfg.Budget.Acquire(ctx, int64(h.cfg.PageBytes))
		if !errors.Is(err, budget.ErrOverloaded) {
			return res, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sendPage writes a page's frames, one at a time, each encoded only once
// the previous one was written.
func (s *session) sendPage(ctx context.Context, page []eventlog.Event, until int64) error {
	for i := range page {
		ev := &page[i]
		if until > 0 && ev.Seq > until {
			return errPageDone
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := s.h.frame(ev, s.buf[:0], slog.LevelDebug)
		if err == nil {
			if err := s.write(data); err != nil {
				return err
			}
			s.sent(ev.Seq)
			s.keepBuf(data)
		}
		s.cur = ev.Seq
		page[i] = eventlog.Event{} // let the body go before the next write
	}
	return nil
}

// keepBuf keeps a frame buffer for the next frame unless it grew large: a
// subscriber that once received a big frame should not hold its size.
func (s *session) keepBuf(data []byte) {
	if cap(data) <= 256<<10 {
		s.buf = data[:0]
	} else {
		s.buf = nil
	}
}

func (s *session) liveLoop(ctx context.Context, sub *subscriber) error {
	tick := time.NewTicker(s.h.cfg.PingInterval)
	defer tick.Stop()
	var spare []liveFrame
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if err := s.maybePing(); err != nil {
				return err
			}
			continue
		case <-s.ctl:
			if err := s.answerPing(); err != nil {
				return err
			}
			continue
		case <-sub.signal:
		}
		frames, tooSlow := sub.take(spare)
		if tooSlow {
			s.logger.Info("subscriber too slow; closing", "seq", s.cur)
			return s.fail(ErrNameConsumerTooSlow, "subscriber fell too far behind")
		}
		// Drop what backfill already sent (the handover overlap).
		i := 0
		for i < len(frames) && frames[i].seq <= s.cur {
			i++
		}
		for len(frames[i:]) > 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(len(frames)-i, maxBatchFrames)
			if err := s.writeFrames(frames[i : i+n]); err != nil {
				return err
			}
			for _, f := range frames[i : i+n] {
				s.sent(f.seq)
			}
			s.cur = frames[i+n-1].seq
			i += n
		}
		clear(frames)
		spare = frames
	}
}

// maxBatchFrames bounds the frames written with one system call.
const maxBatchFrames = 256

// writeFrames writes live frames as WebSocket binary messages in one
// vectored write. Under load a subscriber's queue holds several frames by
// the time it is woken, so the cost per frame falls as the load rises
// instead of one system call per frame per subscriber. Safe only because
// every write to conn happens on this goroutine, between whole messages.
func (s *session) writeFrames(frames []liveFrame) error {
	if err := s.maybePing(); err != nil {
		return err
	}
	if err := s.answerPing(); err != nil {
		return err
	}
	s.hdrs = s.hdrs[:0]
	for _, f := range frames {
		s.hdrs = appendFrameHeader(s.hdrs, len(f.data))
	}
	s.bufs = s.bufs[:0]
	off := 0
	for _, f := range frames {
		n := frameHeaderLen(len(f.data))
		s.bufs = append(s.bufs, s.hdrs[off:off+n], f.data)
		off += n
	}
	nc := s.conn.UnderlyingConn()
	if err := nc.SetWriteDeadline(time.Now().Add(s.h.cfg.WriteTimeout)); err != nil {
		return err
	}
	bufs := s.bufs // WriteTo consumes its receiver
	_, err := bufs.WriteTo(nc)
	clear(s.bufs[:cap(s.bufs)])
	return err
}

// frameHeaderLen is the size of an unmasked WebSocket frame header for a
// payload of n bytes.
func frameHeaderLen(n int) int {
	switch {
	case n < 126:
		return 2
	case n <= 0xffff:
		return 4
	}
	return 10
}

// appendFrameHeader appends the header of a final, unmasked binary frame
// (RFC 6455 §5.2) with an n-byte payload.
func appendFrameHeader(dst []byte, n int) []byte {
	const finBinary = 0x82
	switch {
	case n < 126:
		return append(dst, finBinary, byte(n))
	case n <= 0xffff:
		return append(dst, finBinary, 126, byte(n>>8), byte(n))
	}
	dst = append(dst, finBinary, 127)
	for i := 7; i >= 0; i-- {
		dst = append(dst, byte(uint64(n)>>(8*i)))
	}
	return dst
}

// answerPing sends the pong the read loop asked for, if any.
func (s *session) answerPing() error {
	s.pongMu.Lock()
	p := s.pong
	s.pong = nil
	s.pongMu.Unlock()
	if p == nil {
		return nil
	}
	return s.conn.WriteControl(websocket.PongMessage, []byte(*p), time.Now().Add(s.h.cfg.WriteTimeout))
}

// write sends one frame under the write deadline, pinging first if a ping
// is due (a long backfill must not starve the keepalive).
func (s *session) write(frame []byte) error {
	if err := s.maybePing(); err != nil {
		return err
	}
	if err := s.answerPing(); err != nil {
		return err
	}
	if err := s.conn.SetWriteDeadline(time.Now().Add(s.h.cfg.WriteTimeout)); err != nil {
		return err
	}
	return s.conn.WriteMessage(websocket.BinaryMessage, frame)
}

func (s *session) maybePing() error {
	now := time.Now()
	if now.Sub(s.ping) < s.h.cfg.PingInterval {
		return nil
	}
	s.ping = now
	return s.conn.WriteControl(websocket.PingMessage, nil, now.Add(s.h.cfg.WriteTimeout))
}

// fail sends an error frame and closes the connection; the error returned
// is for the log, the client has been told.
func (s *session) fail(name, msg string) error {
	switch name {
	case ErrNameFutureCursor:
		s.end(EndFutureCursor)
	case ErrNameConsumerTooSlow:
		s.end(EndConsumerSlow)
	}
	if err := s.write(errorFrame(name, msg)); err != nil {
		return err
	}
	s.close(websocket.ClosePolicyViolation, name)
	return nil
}

func (s *session) close(code int, reason string) {
	_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason),
		time.Now().Add(time.Second))
}

// errorFrame encodes an error frame: header {op: -1} and body {error,
// message}. Encoded by hand rather than with indigo's events.ErrorFrame:
// importing indigo's events package here would keep this package out of
// any binary that links the relay (INDIGO.md, trap 7).
func errorFrame(name, msg string) []byte {
	var buf bytes.Buffer
	buf.Write(errorHeader)
	cw := cbg.NewCborWriter(&buf)
	_ = cw.WriteMajorTypeHeader(cbg.MajMap, 2)
	for _, s := range []string{"error", name, "message", msg} {
		_ = cw.WriteMajorTypeHeader(cbg.MajTextString, uint64(len(s)))
		_, _ = cw.WriteString(s)
	}
	return buf.Bytes()
}

var errorHeader = eventlog.FrameHeader(-1, "")

var infoHeader = eventlog.FrameHeader(1, "#info")

// infoFrame encodes an #info frame.
func infoFrame(name, msg string) []byte {
	var buf bytes.Buffer
	buf.Write(infoHeader)
	_ = (&comatproto.SyncSubscribeRepos_Info{Name: name, Message: &msg}).MarshalCBOR(&buf)
	return buf.Bytes()
}

// IsClientGone reports whether err only says the subscriber disconnected.
func IsClientGone(err error) bool {
	var ne net.Error
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) ||
		websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway) ||
		(errors.As(err, &ne) && ne.Timeout())
}
