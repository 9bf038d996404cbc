package budget

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults for a zero Config.
const (
	// DefaultMaxQueue is how many requests may wait for bytes at once. Each
	// waiter is a parked goroutine and an open connection, both cheap; the
	// bound exists so that a flood is refused in microseconds rather than
	// queued for minutes.
	DefaultMaxQueue = 512
	// DefaultRetryAfter is the Retry-After suggested with ErrOverloaded. A
	// full queue drains in seconds, not minutes.
	DefaultRetryAfter = 5 * time.Second
)

// ErrOverloaded means the wait queue is full: the request was refused
// without doing any work. Acquire returns it as an *OverloadedError, which
// matches ErrOverloaded with errors.Is.
var ErrOverloaded = errors.New("server overloaded: in-flight byte budget wait queue is full")

// OverloadedError is the error Acquire returns when the wait queue is full.
type OverloadedError struct {
	// RetryAfter is how long the client should wait before trying again.
	RetryAfter time.Duration
	// Queued is the queue length at the time of refusal (for the log).
	Queued int
}

// Error implements error.
func (e *OverloadedError) Error() string {
	return fmt.Sprintf("%v (%d waiting)", ErrOverloaded, e.Queued)
}

// Is makes errors.Is(err, ErrOverloaded) true.
func (e *OverloadedError) Is(target error) bool { return target == ErrOverloaded }

// Config tunes a Budget. The zero value works: capacity sized from memory,
// DefaultMaxQueue waiters.
type Config struct {
	// Capacity is the bytes that may be reserved at once. Zero or less means
	// DefaultCapacity(), a quarter of the memory available, at most 1 GiB.
	Capacity int64
	// MaxQueue is how many requests may wait at once; one more is refused
	// with ErrOverloaded. Zero means DefaultMaxQueue; negative means no
	// queue at all (refuse whatever does not fit at once).
	MaxQueue int
	// RetryAfter is the hint returned with ErrOverloaded (default
	// DefaultRetryAfter).
	RetryAfter time.Duration
}

// Budget is an in-flight byte budget with a bounded FIFO wait queue. It is
// safe for concurrent use. A nil *Budget is valid and admits everything,
// so that code paths can be written once whether or not a budget is
// configured.
type Budget struct {
	capacity   int64
	maxQueue   int
	retryAfter time.Duration

	mu    sync.Mutex
	inUse int64
	queue list.List // of *waiter, front = oldest
	// seq numbers arrivals and admissions, so that tests can check the
	// admission order without relying on goroutine scheduling.
	arrivals   uint64
	admissions uint64

	admitted uint64
	waited   uint64
	rejected uint64
	canceled uint64
}

type waiter struct {
	n       int64
	arrival uint64
	ready   chan struct{} // closed once admitted
	res     *Reservation  // set when admitted, under Budget.mu
}

// New returns a Budget for cfg.
func New(cfg Config) *Budget {
	if cfg.Capacity <= 0 {
		cfg.Capacity = DefaultCapacity()
	}
	switch {
	case cfg.MaxQueue == 0:
		cfg.MaxQueue = DefaultMaxQueue
	case cfg.MaxQueue < 0:
		cfg.MaxQueue = 0
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	return &Budget{capacity: cfg.Capacity, maxQueue: cfg.MaxQueue, retryAfter: cfg.RetryAfter}
}

// Reservation is bytes held from a Budget. Release it when the work is done
// (defer r.Release()). Its methods are safe for concurrent use and on a nil
// *Reservation.
type Reservation struct {
	b        *Budget
	n        int64
	released bool
	// arrival and admission are the Budget's sequence numbers for this
	// reservation (tests check that admission order is arrival order).
	arrival   uint64
	admission uint64
}

// fits reports whether n bytes may be admitted now. A request larger than
// the capacity fits only into an empty budget, and then runs alone. Called
// with b.mu held.
func (b *Budget) fits(n int64) bool {
	return b.inUse == 0 || b.inUse+n <= b.capacity
}

// Acquire reserves n bytes, waiting in FIFO order behind earlier requests
// until they fit. It returns ErrOverloaded (an *OverloadedError) at once
// when n does not fit immediately and the wait queue is full, and ctx's
// error when ctx ends while waiting; in both cases nothing is held. A
// negative n counts as zero. Even a zero-byte request waits its turn when
// others are queued: nothing overtakes.
func (b *Budget) Acquire(ctx context.Context, n int64) (*Reservation, error) {
	if b == nil {
		return &Reservation{}, nil
	}
	n = max(n, 0)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.arrivals++
	arrival := b.arrivals
	if b.queue.Len() == 0 && b.fits(n) {
		r := b.admit(n, arrival)
		b.mu.Unlock()
		return r, nil
	}
	if b.queue.Len() >= b.maxQueue {
		b.rejected++
		queued := b.queue.Len()
		b.mu.Unlock()
		return nil, &OverloadedError{RetryAfter: b.retryAfter, Queued: queued}
	}
	w := &waiter{n: n, arrival: arrival, ready: make(chan struct{})}
	el := b.queue.PushBack(w)
	b.waited++
	b.mu.Unlock()

	select {
	case <-w.ready:
		return w.res, nil
	case <-ctx.Done():
	}

	b.mu.Lock()
	b.canceled++
	granted := w.res
	if granted == nil {
		head := b.queue.Front() == el
		b.queue.Remove(el)
		if head {
			// The head was blocking everyone behind it; they may fit now.
			b.grant()
		}
	}
	b.mu.Unlock()
	if granted != nil {
		// Admitted just as ctx ended. The client is gone: give the bytes
		// back rather than start work nobody will read.
		granted.Release()
	}
	return nil, ctx.Err()
}

// admit takes n bytes for a new reservation. Called with b.mu held.
func (b *Budget) admit(n int64, arrival uint64) *Reservation {
	b.inUse += n
	b.admissions++
	b.admitted++
	return &Reservation{b: b, n: n, arrival: arrival, admission: b.admissions}
}

// grant admits waiters from the head of the queue while they fit, and stops
// at the first that does not: nothing behind it may overtake it. Called
// with b.mu held whenever bytes come free or the head leaves.
func (b *Budget) grant() {
	for el := b.queue.Front(); el != nil; el = b.queue.Front() {
		w := el.Value.(*waiter)
		if !b.fits(w.n) {
			return
		}
		b.queue.Remove(el)
		w.res = b.admit(w.n, w.arrival)
		close(w.ready)
	}
}

// Size returns the bytes the reservation holds (0 once released).
func (r *Reservation) Size() int64 {
	if r == nil || r.b == nil {
		return 0
	}
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.released {
		return 0
	}
	return r.n
}

// Resize trues up the reservation to n bytes once the real cost is known.
// Shrinking returns bytes at once and may admit waiters. Growing never
// blocks: the work is already under way and blocking it while it holds
// bytes could deadlock the budget, so the extra bytes are accounted
// immediately even if that takes the budget over its capacity; later
// requests then wait until enough is released. Size estimates generously
// up front so that growth is rare and small. Resize after Release does
// nothing.
func (r *Reservation) Resize(n int64) {
	if r == nil || r.b == nil {
		return
	}
	n = max(n, 0)
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.released {
		return
	}
	delta := n - r.n
	r.n = n
	b.inUse += delta
	if delta < 0 {
		b.grant()
	}
}

// Release returns the reservation's bytes and admits the waiters that now
// fit. Calling it more than once is harmless.
func (r *Reservation) Release() {
	if r == nil || r.b == nil {
		return
	}
	b := r.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.released {
		return
	}
	r.released = true
	b.inUse -= r.n
	b.grant()
}

// Stats is a snapshot of a Budget, for metrics.
type Stats struct {
	// Capacity is the configured capacity in bytes.
	Capacity int64
	// InUse is the bytes reserved now. It can exceed Capacity while a
	// request larger than the capacity runs, or after a Resize upwards.
	InUse int64
	// QueueLen is the number of requests waiting.
	QueueLen int
	// MaxQueue is the configured queue bound.
	MaxQueue int
	// Admitted counts reservations granted, at once or after waiting.
	Admitted uint64
	// Waited counts requests that had to queue.
	Waited uint64
	// Rejected counts requests refused with ErrOverloaded (the 503s).
	Rejected uint64
	// Canceled counts waiters whose context ended before admission.
	Canceled uint64
}

// Stats returns a snapshot of the budget's state. A nil Budget reports
// zeros.
func (b *Budget) Stats() Stats {
	if b == nil {
		return Stats{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return Stats{
		Capacity: b.capacity,
		InUse:    b.inUse,
		QueueLen: b.queue.Len(),
		MaxQueue: b.maxQueue,
		Admitted: b.admitted,
		Waited:   b.waited,
		Rejected: b.rejected,
		Canceled: b.canceled,
	}
}

// Capacity returns the configured capacity in bytes (0 for a nil Budget,
// which has none).
func (b *Budget) Capacity() int64 {
	if b == nil {
		return 0
	}
	return b.capacity
}

// Guard is the one call a handler makes before expensive work: it reserves
// n bytes from b (a nil b admits everything) and returns the function that
// gives them back.
//
//	release, err := budget.Guard(r.Context(), s.budget, estimate)
//	if err != nil {
//		return err // ErrOverloaded → 503 ServiceOverloaded; ctx error → client gone
//	}
//	defer release()
func Guard(ctx context.Context, b *Budget, n int64) (release func(), err error) {
	r, err := b.Acquire(ctx, n)
	if err != nil {
		return func() {}, err
	}
	return r.Release, nil
}
