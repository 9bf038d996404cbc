package cluster

import (
	"net/netip"
	"sync"
	"syscall"
)

// maxPollBatch bounds the datagrams one Poll reads.
const maxPollBatch = 4096

// pollBufs are Poll's read buffers.
var pollBufs = sync.Pool{New: func() any { b := make([]byte, hintBuffer); return &b }}

// pollFD is a duplicate of the socket's descriptor for Poll: reads through
// the net package wait in turn (the reading goroutine holds its turn while
// it waits), so Poll reads with system calls of its own, which never wait
// (MSG_DONTWAIT). mu is held by one Poll at a time, and keeps the
// descriptor open while it is used.
type pollFD struct {
	mu sync.Mutex
	fd int // -1 once closed
}

// openPollFD duplicates h's socket descriptor.
func (h *Hints) openPollFD() error {
	raw, err := h.conn.SyscallConn()
	if err != nil {
		return err
	}
	var dupErr error
	h.poll.fd = -1
	err = raw.Control(func(fd uintptr) {
		h.poll.fd, dupErr = syscall.Dup(int(fd))
	})
	if err != nil {
		return err
	}
	if dupErr != nil {
		h.poll.fd = -1
		return dupErr
	}
	syscall.CloseOnExec(h.poll.fd)
	return nil
}

// closePollFD closes the duplicate, once no Poll uses it.
func (h *Hints) closePollFD() {
	h.poll.mu.Lock()
	defer h.poll.mu.Unlock()
	if h.poll.fd >= 0 {
		_ = syscall.Close(h.poll.fd)
		h.poll.fd = -1
	}
}

// Poll reads the hints already waiting on the socket, without waiting for
// more, and hands them on before it returns. A writer calls it just
// before it looks at its hints: a hint sent before the client was
// answered has reached this host before the client's next request did,
// and is read then, whenever Run last drained the socket.
//
// Polls take turns: a datagram another Poll (Run's drain, another
// writer) has read but not yet handed on is no longer on the socket, so
// a Poll that did not wait for it would return without a hint that had
// arrived.
func (h *Hints) Poll() {
	h.poll.mu.Lock()
	defer h.poll.mu.Unlock()
	if h.poll.fd < 0 {
		return
	}
	bp := pollBufs.Get().(*[]byte)
	defer pollBufs.Put(bp)
	buf := *bp
	for range maxPollBatch {
		n, from, err := syscall.Recvfrom(h.poll.fd, buf, syscall.MSG_DONTWAIT)
		if err != nil {
			return
		}
		var ap netip.AddrPort
		switch sa := from.(type) {
		case *syscall.SockaddrInet4:
			ap = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
		case *syscall.SockaddrInet6:
			ap = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
		default:
			continue
		}
		h.handle(ap, buf[:n])
	}
}
