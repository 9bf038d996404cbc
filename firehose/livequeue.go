package firehose

import "sync"

// liveFrame is one encoded event, shared by every subscriber's queue.
type liveFrame struct {
	seq  int64
	kind string // the frame's kind, for the metrics
	data []byte
}

// liveQueue holds the live frames waiting for one subscription's socket.
type liveQueue struct {
	signal chan struct{}

	mu      sync.Mutex
	q       []liveFrame
	qBytes  int
	tooSlow bool
}

// push queues frames, or marks the subscriber too slow (and returns false)
// when they do not fit.
func (s *liveQueue) push(frames []liveFrame, maxFrames, maxBytes int) bool {
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
func (s *liveQueue) take(spare []liveFrame) ([]liveFrame, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	s.q, s.qBytes = spare[:0], 0
	return q, s.tooSlow
}
