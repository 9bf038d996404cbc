package firehose

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/metrics"
)

// subscription is one com.atproto.sync.subscribeRepos stream being served:
// its cursor, its socket and its share of the live fan-out.
type subscription struct {
	h      *Hub
	conn   *websocket.Conn
	cancel context.CancelFunc
	logger *slog.Logger
	track  *Conn // nil without consumer health
	cur    int64 // last seq written
	buf    []byte
	ping   time.Time

	// endOnce keeps the first reason the subscription ended for: the read
	// loop and the writer may both see the end.
	endOnce sync.Once
	reason  EndReason

	// Only the subscription's own goroutine writes to conn, so that live
	// frames can go out in batches straight to the socket (see
	// writeFrames). The read loop hands pings it must answer over ctl.
	ctl    chan struct{}
	pongMu sync.Mutex
	pong   *string
	hdrs   []byte
	bufs   net.Buffers

	// pager holds the backfill's page from one read to the next, so a
	// replay of any length allocates almost nothing per event; dropped
	// once the subscription goes live.
	pager *eventlog.Pager
}

// errClosed is a subscription ended by the hub (shutdown).
var errClosed = errors.New("firehose closed")

// Serve runs one subscription on an upgraded connection until the client
// goes away, ctx ends or the hub closes, and closes conn. cursor nil means
// live only. It returns why the subscription ended (nil for a client that
// disconnected).
func (h *Hub) Serve(ctx context.Context, conn *websocket.Conn, cursor *int64, client Client) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer conn.Close()
	s := &subscription{h: h, conn: conn, cancel: cancel, logger: h.logger, ctl: make(chan struct{}, 1)}
	if cursor != nil {
		s.logger = s.logger.With("cursor", *cursor)
	}
	if h.cfg.Health != nil {
		s.track = h.cfg.Health.Start(client.IP, client.UserAgent, cursor)
	}
	defer func() {
		// Whatever ended it first has said why; this is the fallback.
		s.end(EndOther)
		countDisconnect(s.reason)
	}()

	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		s.end(EndServerShutdown)
		s.close(websocket.CloseGoingAway, "server shutting down")
		return errClosed
	}
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	metrics.FirehoseSubscribers.Inc()
	defer func() {
		h.mu.Lock()
		delete(h.subs, s)
		h.mu.Unlock()
		metrics.FirehoseSubscribers.Dec()
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
		s.endErr(endReasonFor(err), err)
	}
	return err
}

// end records why the subscription ended, for consumer health and the
// metrics; the first reason recorded stands.
func (s *subscription) end(r EndReason) { s.endErr(r, nil) }

// endErr is end with the error it ended on.
func (s *subscription) endErr(r EndReason, err error) {
	s.endOnce.Do(func() { s.reason = r })
	if s.track != nil {
		s.track.EndErr(r, err)
	}
}

// sent records a frame written, for consumer health.
func (s *subscription) sent(seq int64) {
	if s.track != nil {
		s.track.Sent(seq)
	}
}

// endReasonFor classifies the error a subscription ended on.
func endReasonFor(err error) EndReason {
	var ne net.Error
	var ce *websocket.CloseError
	switch {
	case errors.As(err, &ce):
		return closeReason(ce.Code)
	case errors.As(err, &ne) && ne.Timeout():
		return EndWriteTimeout
	case errors.Is(err, net.ErrClosed), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, websocket.ErrCloseSent):
		return EndWriteError
	}
	return EndOther
}

// closeReason classifies the close code a client ended a subscription
// with: 1009 says it refused a frame over its read limit, as relays do.
func closeReason(code int) EndReason {
	switch code {
	case websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived, websocket.CloseAbnormalClosure:
		return EndClientClosed
	case websocket.CloseMessageTooBig:
		return EndRefusedFrame
	}
	return EndClientError
}

// readLoop consumes what the client sends (pongs, pings, close) and
// cancels the subscription when the connection ends or stays silent past
// PongTimeout.
func (s *subscription) readLoop() {
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
			var ce *websocket.CloseError
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				s.end(EndReadError) // silent past PongTimeout
			case errors.As(err, &ce):
				s.endErr(closeReason(ce.Code), err)
			default:
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

func (s *subscription) run(ctx context.Context, cursor *int64) error {
	h := s.h
	queue := &liveQueue{signal: make(chan struct{}, 1)}
	defer h.unregister(queue)
	s.ping = time.Now()
	if err := s.hold(ctx); err != nil {
		return err
	}

	if cursor == nil {
		s.served()
		s.cur = h.register(queue)
		return s.liveLoop(ctx, queue)
	}
	from, err := s.resolve(ctx, *cursor)
	if err != nil || from < 0 {
		return err
	}
	s.served()
	s.cur = from
	// Catch up through pages until the log is (nearly) exhausted, then
	// join the live fan-out, then read the few events sequenced in between:
	// everything after start comes through the queue, so nothing is missed
	// and, filtering by seq, nothing is sent twice.
	s.pager = h.log.NewPager()
	if err := s.backfill(ctx, func() bool { return s.cur >= h.lastDelivered() }, 0); err != nil {
		return err
	}
	start := h.register(queue)
	if s.cur < start {
		if err := s.backfill(ctx, nil, start); err != nil {
			return err
		}
	}
	s.pager.Release(-1)
	s.pager = nil
	return s.liveLoop(ctx, queue)
}

// hold keeps a stuck consumer's connection waiting, answering pings and
// doing no other work, until the event it is stuck on is repaired or
// Health's time limit passes (see Conn.Hold).
func (s *subscription) hold(ctx context.Context) error {
	if s.track == nil {
		return nil
	}
	release, limit := s.track.Hold(ctx)
	if release == nil {
		return nil
	}
	defer s.track.Unhold()
	s.logger.Debug("holding a stuck consumer's connection until its event is repaired", "limit", limit)
	timer := time.NewTimer(limit)
	defer timer.Stop()
	tick := time.NewTicker(s.h.cfg.PingInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-release:
			return nil
		case <-timer.C:
			return nil
		case <-tick.C:
			if err := s.maybePing(); err != nil {
				return err
			}
		case <-s.ctl:
			if err := s.answerPing(); err != nil {
				return err
			}
		}
	}
}

// served records, for consumer health, that the subscription's cursor was
// accepted.
func (s *subscription) served() {
	if s.track != nil {
		s.track.Served()
	}
}

// resolve turns a cursor into the seq to replay after, reading only seqs
// and creation times. A negative result means the subscription is over (an
// error frame was sent).
func (s *subscription) resolve(ctx context.Context, cursor int64) (int64, error) {
	h := s.h
	last, err := h.log.LastSeq(ctx)
	if err != nil {
		return -1, err
	}
	if cursor > last {
		s.logger.Debug("future cursor", "last_seq", last)
		if s.track != nil {
			s.track.FutureCursor(last)
		}
		return -1, s.fail(ErrNameFutureCursor, "cursor is beyond the latest event")
	}
	windowStart := time.Now().Add(-h.cfg.Retention)
	if cursor > 0 {
		got, at, err := h.log.CursorPoint(ctx, cursor)
		if errors.Is(err, eventlog.ErrNoEvent) {
			if cursor < last {
				// Everything after the cursor was pruned: the window is
				// empty, so the stream goes on live from the end.
				if err := s.writeInfo(InfoOutdatedCursor, outdatedMessage); err != nil {
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
		if err := s.writeInfo(InfoOutdatedCursor, outdatedMessage); err != nil {
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
func (s *subscription) backfill(ctx context.Context, done func() bool, until int64) error {
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
		page, err := s.pager.Page(ctx, s.cur, h.cfg.PageEvents, h.cfg.PageBytes)
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
		// Keep the page's memory for the next one, unless one large
		// event grew it well past a page.
		s.pager.Release(2 * h.cfg.PageBytes)
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
func (s *subscription) sendPage(ctx context.Context, page []eventlog.Event, until int64) error {
	for i := range page {
		ev := &page[i]
		if until > 0 && ev.Seq > until {
			return errPageDone
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		data, kind, err := s.h.frame(ev, s.buf[:0], slog.LevelDebug)
		if err == nil {
			if err := s.write(data); err != nil {
				return err
			}
			countFrame(kind, len(data))
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
func (s *subscription) keepBuf(data []byte) {
	if cap(data) <= 256<<10 {
		s.buf = data[:0]
	} else {
		s.buf = nil
	}
}

func (s *subscription) liveLoop(ctx context.Context, queue *liveQueue) error {
	tick := time.NewTicker(s.h.cfg.PingInterval)
	defer tick.Stop()
	var spare []liveFrame
	var tally frameTally
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
		case <-queue.signal:
		}
		frames, tooSlow := queue.take(spare)
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
				tally.add(f.kind, len(f.data))
			}
			tally.flush()
			s.cur = frames[i+n-1].seq
			i += n
		}
		clear(frames)
		spare = frames
	}
}

// answerPing sends the pong the read loop asked for, if any.
func (s *subscription) answerPing() error {
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
func (s *subscription) write(frame []byte) error {
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

func (s *subscription) maybePing() error {
	now := time.Now()
	if now.Sub(s.ping) < s.h.cfg.PingInterval {
		return nil
	}
	s.ping = now
	return s.conn.WriteControl(websocket.PingMessage, nil, now.Add(s.h.cfg.WriteTimeout))
}

// fail sends an error frame and closes the connection; the error returned
// is for the log, the client has been told.
func (s *subscription) fail(name, msg string) error {
	switch name {
	case ErrNameFutureCursor:
		s.end(EndFutureCursor)
	case ErrNameConsumerTooSlow:
		s.end(EndConsumerSlow)
	}
	frame := errorFrame(name, msg)
	if err := s.write(frame); err != nil {
		return err
	}
	countFrame(frameKindError, len(frame))
	s.close(websocket.ClosePolicyViolation, name)
	return nil
}

// writeInfo sends an #info frame.
func (s *subscription) writeInfo(name, msg string) error {
	frame := infoFrame(name, msg)
	if err := s.write(frame); err != nil {
		return err
	}
	countFrame(frameKindInfo, len(frame))
	return nil
}

func (s *subscription) close(code int, reason string) {
	_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason),
		time.Now().Add(time.Second))
}
