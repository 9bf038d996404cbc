package firehose

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/gorilla/websocket"
	cbg "github.com/whyrusleeping/cbor-gen"

	"github.com/bulwark-pds/bulwark/eventlog"
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

// maxBatchFrames bounds the frames written with one system call.
const maxBatchFrames = 256

// writeFrames writes live frames as WebSocket binary messages in one
// vectored write. Under load a subscriber's queue holds several frames by
// the time it is woken, so the cost per frame falls as the load rises
// instead of one system call per frame per subscriber. Safe only because
// every write to conn happens on this goroutine, between whole messages.
func (s *subscription) writeFrames(frames []liveFrame) error {
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

// errorFrame encodes an error frame: header {op: -1} and body {error,
// message}. Encoded by hand rather than with indigo's events.ErrorFrame:
// importing indigo's events package here would keep this package out of
// any binary that links the relay (indigo's relay stream package, a fork of
// events, registers the same Prometheus metric names: linking both panics
// at init).
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

// IsClientGone reports whether err only says the subscriber disconnected,
// or dropped the connection (reset it, closed it with an error code)
// while it was being written to. Consumer health reports those, once per
// run of failures (HealthConfig): a consumer redialing in a loop must not
// cost a log line per connection.
func IsClientGone(err error) bool {
	var ne net.Error
	var ce *websocket.CloseError
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.As(err, &ce) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, websocket.ErrCloseSent) ||
		(errors.As(err, &ne) && ne.Timeout())
}
