package budget

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type result struct {
	res *Reservation
	err error
}

// acquireAsync starts an Acquire in its own goroutine and waits until it
// is either queued or done, so that arrival order is the call order.
func acquireAsync(t *testing.T, ctx context.Context, b *Budget, n int64) chan result {
	t.Helper()
	before := b.Stats()
	ch := make(chan result, 1)
	go func() {
		r, err := b.Acquire(ctx, n)
		ch <- result{r, err}
	}()
	// Wait for the request to be counted: queued, admitted or refused.
	waitFor(t, func() bool {
		s := b.Stats()
		return s.Waited > before.Waited || s.Admitted > before.Admitted || s.Rejected > before.Rejected
	})
	return ch
}

// waitFor waits until cond holds: the budget's counters are how the test
// learns that another goroutine's request has reached the budget. It
// asserts nothing about how long that takes (the limit is a hang guard).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 30*time.Second, 100*time.Microsecond, "condition not reached")
}

func receive(t *testing.T, ch chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no result")
		return result{}
	}
}

func pending(ch chan result) bool {
	select {
	case r := <-ch:
		// Put it back for a later receive.
		ch <- r
		return false
	default:
		return true
	}
}

func TestFIFOOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(Config{Capacity: 10, MaxQueue: 100})
	hold, err := b.Acquire(ctx, 10)
	require.NoError(t, err)

	sizes := []int64{3, 1, 7, 2, 2, 9, 1, 1, 5, 4, 10, 1}
	var chans []chan result
	for i, n := range sizes {
		chans = append(chans, acquireAsync(t, ctx, b, n))
		require.Equal(t, i+1, b.Stats().QueueLen)
	}
	hold.Release()

	// Release each admitted reservation as it arrives, in whatever order
	// the goroutines deliver them; the admission order is recorded by the
	// budget itself.
	var got []*Reservation
	for _, ch := range chans {
		r := receive(t, ch)
		require.NoError(t, r.err)
		got = append(got, r.res)
		r.res.Release()
	}
	for i := 1; i < len(got); i++ {
		require.Greater(t, got[i].arrival, got[i-1].arrival)
		require.Greater(t, got[i].admission, got[i-1].admission, "request %d was admitted before request %d", i, i-1)
	}
	s := b.Stats()
	require.Zero(t, s.InUse)
	require.Zero(t, s.QueueLen)
}

// TestNoStarvation: a request larger than the whole budget arrives while
// small requests keep arriving that would fit in the free space. None of
// them overtakes it; it is admitted alone as soon as what was in flight
// before it drains, and the small ones then proceed in arrival order.
func TestNoStarvation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(Config{Capacity: 10, MaxQueue: 100})

	var holders []*Reservation
	for range 3 {
		r, err := b.Acquire(ctx, 3)
		require.NoError(t, err)
		holders = append(holders, r)
	}
	big := acquireAsync(t, ctx, b, 25)
	require.Equal(t, 1, b.Stats().QueueLen)

	var smalls []chan result
	for i, h := range holders {
		// A small request would fit in the free byte (9 of 10 in use) but
		// must queue behind the big one.
		smalls = append(smalls, acquireAsync(t, ctx, b, 1))
		require.Equal(t, 2+i, b.Stats().QueueLen)
		require.True(t, pending(big), "big admitted while %d holders remain", len(holders)-i)
		h.Release()
	}

	// Bounded: admitted exactly when the last request ahead of it finished.
	bigRes := receive(t, big)
	require.NoError(t, bigRes.err)
	s := b.Stats()
	require.Equal(t, int64(25), s.InUse, "the oversized request runs alone")
	require.Equal(t, len(smalls), s.QueueLen)
	for _, ch := range smalls {
		require.True(t, pending(ch))
	}

	bigRes.res.Release()
	var got []*Reservation
	for _, ch := range smalls {
		r := receive(t, ch)
		require.NoError(t, r.err)
		require.Greater(t, r.res.admission, bigRes.res.admission)
		got = append(got, r.res)
	}
	for i := 1; i < len(got); i++ {
		require.Greater(t, got[i].admission, got[i-1].admission)
	}
	for _, r := range got {
		r.Release()
	}
	require.Zero(t, b.Stats().InUse)
}

// TestNoStarvationUnderChurn runs the same scenario with goroutines that
// acquire and release small reservations continuously. Whatever the
// scheduling, no small request that arrived after the big one is admitted
// before it.
func TestNoStarvationUnderChurn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := New(Config{Capacity: 100, MaxQueue: 1000})

	var mu sync.Mutex
	var smalls []*Reservation
	var wg sync.WaitGroup
	var stop atomic.Bool
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				r, err := b.Acquire(ctx, 7)
				if err != nil {
					return
				}
				mu.Lock()
				smalls = append(smalls, r)
				mu.Unlock()
				r.Release()
			}
		}()
	}
	waitFor(t, func() bool { return b.Stats().Admitted >= 100 })

	bigRes, err := b.Acquire(ctx, 1000)
	require.NoError(t, err)
	bigRes.Release()
	waitFor(t, func() bool { return b.Stats().Admitted >= bigRes.admission+100 })
	stop.Store(true)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	overtook := 0
	for _, r := range smalls {
		if r.arrival > bigRes.arrival && r.admission < bigRes.admission {
			overtook++
		}
	}
	require.Zero(t, overtook)
	// Bounded steps: only requests that arrived before it can have been
	// admitted before it.
	require.LessOrEqual(t, bigRes.admission, bigRes.arrival)
	require.Zero(t, b.Stats().InUse)
}

// TestAdmissionOrderIsArrivalOrder hammers the budget from many goroutines
// with random sizes (some over the capacity) and checks the invariant the
// whole design rests on: reservations are admitted in the order they
// arrived.
func TestAdmissionOrderIsArrivalOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(Config{Capacity: 64, MaxQueue: 1 << 20})
	var mu sync.Mutex
	var all []*Reservation
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				n := rng.Int64N(40)
				if rng.IntN(50) == 0 {
					n = 100
				}
				r, err := b.Acquire(ctx, n)
				if !assertNoError(t, err) {
					return
				}
				if rng.IntN(4) == 0 {
					r.Resize(n / 2)
				}
				mu.Lock()
				all = append(all, r)
				mu.Unlock()
				r.Release()
				r.Release()
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(all, func(a, b *Reservation) int { return int(a.arrival) - int(b.arrival) })
	for i := 1; i < len(all); i++ {
		require.Greater(t, all[i].admission, all[i-1].admission)
	}
	s := b.Stats()
	require.Zero(t, s.InUse)
	require.Zero(t, s.QueueLen)
	require.Equal(t, uint64(len(all)), s.Admitted)
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func TestFullQueueRefusesAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(Config{Capacity: 10, MaxQueue: 2, RetryAfter: 3 * time.Second})
	hold, err := b.Acquire(ctx, 10)
	require.NoError(t, err)
	w1 := acquireAsync(t, ctx, b, 1)
	w2 := acquireAsync(t, ctx, b, 1)

	_, err = b.Acquire(ctx, 1)
	require.ErrorIs(t, err, ErrOverloaded)
	var oe *OverloadedError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, 3*time.Second, oe.RetryAfter)
	require.Equal(t, 2, oe.Queued)
	s := b.Stats()
	require.Equal(t, uint64(1), s.Rejected)
	require.Equal(t, 2, s.QueueLen)

	hold.Release()
	for _, ch := range []chan result{w1, w2} {
		r := receive(t, ch)
		require.NoError(t, r.err)
		r.res.Release()
	}
}

// TestFullQueueDoesNoWork: behind an HTTP handler, a refused request reads
// none of the bytes it would have served.
func TestFullQueueDoesNoWork(t *testing.T) {
	t.Parallel()
	b := New(Config{Capacity: 100, MaxQueue: 1})
	var bytesRead atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, err := Guard(r.Context(), b, 100)
		if errors.Is(err, ErrOverloaded) {
			w.Header().Set("Retry-After", "5")
			http.Error(w, `{"error":"ServiceOverloaded"}`, http.StatusServiceUnavailable)
			return
		}
		if err != nil {
			t.Error(err)
			return
		}
		defer release()
		bytesRead.Add(100) // stands in for reading the repo from Postgres
		_, _ = w.Write([]byte(strings.Repeat("x", 100)))
	})

	hold, err := b.Acquire(context.Background(), 100)
	require.NoError(t, err)
	queued := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		queued <- rec.Code
	}()
	waitFor(t, func() bool { return b.Stats().QueueLen == 1 })

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "5", rec.Header().Get("Retry-After"))
	require.Zero(t, bytesRead.Load(), "the refused request did work")

	hold.Release()
	require.Equal(t, http.StatusOK, <-queued)
	require.Equal(t, int64(100), bytesRead.Load())
}

func TestCancelLeavesQueueAndWakesOthers(t *testing.T) {
	t.Parallel()
	b := New(Config{Capacity: 10, MaxQueue: 10})
	bg := context.Background()
	hold, err := b.Acquire(bg, 5)
	require.NoError(t, err)

	headCtx, cancelHead := context.WithCancel(bg)
	head := acquireAsync(t, headCtx, b, 10)
	midCtx, cancelMid := context.WithCancel(bg)
	second := acquireAsync(t, bg, b, 2)
	mid := acquireAsync(t, midCtx, b, 1)
	third := acquireAsync(t, bg, b, 3)
	require.Equal(t, 4, b.Stats().QueueLen)

	// A waiter in the middle leaves: nothing else changes.
	cancelMid()
	require.ErrorIs(t, receive(t, mid).err, context.Canceled)
	require.Equal(t, 3, b.Stats().QueueLen)
	require.True(t, pending(second))

	// The head leaves: those behind it fit now and are admitted in order.
	cancelHead()
	require.ErrorIs(t, receive(t, head).err, context.Canceled)
	r2, r3 := receive(t, second), receive(t, third)
	require.NoError(t, r2.err)
	require.NoError(t, r3.err)
	require.Less(t, r2.res.admission, r3.res.admission)
	s := b.Stats()
	require.Equal(t, int64(10), s.InUse)
	require.Zero(t, s.QueueLen)
	require.Equal(t, uint64(2), s.Canceled)

	hold.Release()
	r2.res.Release()
	r3.res.Release()
	require.Zero(t, b.Stats().InUse)
}

func TestAcquireWithEndedContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := New(Config{Capacity: 10})
	_, err := b.Acquire(ctx, 1)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, b.Stats().InUse)
}

func TestResize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(Config{Capacity: 10, MaxQueue: 10})
	r, err := b.Acquire(ctx, 8)
	require.NoError(t, err)
	w := acquireAsync(t, ctx, b, 5)

	// Shrinking frees bytes for the waiter.
	r.Resize(4)
	rw := receive(t, w)
	require.NoError(t, rw.err)
	require.Equal(t, int64(9), b.Stats().InUse)

	// Growing never blocks, even past the capacity; later requests wait.
	r.Resize(20)
	require.Equal(t, int64(20), r.Size())
	require.Equal(t, int64(25), b.Stats().InUse)
	late := acquireAsync(t, ctx, b, 1)
	require.Equal(t, 1, b.Stats().QueueLen)
	rw.res.Release()
	require.True(t, pending(late))
	r.Release()
	rl := receive(t, late)
	require.NoError(t, rl.err)
	rl.res.Release()

	// Release is idempotent; Resize after Release does nothing.
	r.Release()
	r.Resize(100)
	require.Zero(t, r.Size())
	require.Zero(t, b.Stats().InUse)
}

func TestNoQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := New(Config{Capacity: 10, MaxQueue: -1})
	r, err := b.Acquire(ctx, 10)
	require.NoError(t, err)
	_, err = b.Acquire(ctx, 1)
	require.ErrorIs(t, err, ErrOverloaded)
	r.Release()
}

func TestNilBudgetAdmitsEverything(t *testing.T) {
	t.Parallel()
	var b *Budget
	release, err := Guard(context.Background(), b, 1<<40)
	require.NoError(t, err)
	release()
	r, err := b.Acquire(context.Background(), 5)
	require.NoError(t, err)
	r.Resize(10)
	r.Release()
	require.Zero(t, r.Size())
	require.Equal(t, Stats{}, b.Stats())
}

func TestZeroConfig(t *testing.T) {
	t.Parallel()
	b := New(Config{})
	s := b.Stats()
	require.Equal(t, DefaultCapacity(), s.Capacity)
	require.GreaterOrEqual(t, s.Capacity, int64(MinDefaultCapacity))
	require.LessOrEqual(t, s.Capacity, int64(MaxDefaultCapacity))
	require.Equal(t, DefaultMaxQueue, s.MaxQueue)
}

func TestCapacityFromMemory(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mem, want int64
	}{
		{mem: 512 << 20, want: 128 << 20},
		{mem: 24 << 30, want: MaxDefaultCapacity},
		{mem: 32 << 20, want: MinDefaultCapacity},
	} {
		require.Equal(t, tc.want, capacityFrom(tc.mem), "memory %d", tc.mem)
	}
}

func TestParseCgroupLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"max\n", 0, false},
		{"536870912\n", 512 << 20, true},
		{"9223372036854771712\n", 0, false}, // cgroup v1 "unlimited"
		{"", 0, false},
		{"garbage", 0, false},
	} {
		v, ok := parseCgroupLimit(tc.in)
		require.Equal(t, tc.ok, ok, "%q", tc.in)
		require.Equal(t, tc.want, v, "%q", tc.in)
	}
}

func TestParseMemTotal(t *testing.T) {
	t.Parallel()
	v, ok := parseMemTotal(strings.NewReader("MemFree: 10 kB\nMemTotal:       24684092 kB\nMemAvailable: 5 kB\n"))
	require.True(t, ok)
	require.Equal(t, int64(24684092*1024), v)
	_, ok = parseMemTotal(strings.NewReader("nothing here\n"))
	require.False(t, ok)
}

// TestMeasureHeap is not parallel: it reads process-wide heap figures.
func TestMeasureHeap(t *testing.T) {
	const size = 8 << 20
	c := MeasureHeap(func() any {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	})
	require.GreaterOrEqual(t, c.Allocated, uint64(size))
	// Other tests' garbage collected in between can shave a little off.
	require.GreaterOrEqual(t, c.Retained, uint64(size)*9/10)
	require.GreaterOrEqual(t, c.Peak, c.Retained)
}

func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	bud := New(Config{Capacity: 1 << 30})
	b.ReportAllocs()
	for b.Loop() {
		r, err := bud.Acquire(ctx, 4096)
		if err != nil {
			b.Fatal(err)
		}
		r.Release()
	}
}

func BenchmarkAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	bud := New(Config{Capacity: 1 << 30})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := bud.Acquire(ctx, 4096)
			if err != nil {
				b.Fatal(err)
			}
			r.Release()
		}
	})
}

// BenchmarkAcquireContended has acquirers wait: the capacity holds one
// request at a time and eight goroutines compete, so most go through the
// queue (a parked goroutine and a wake-up each).
func BenchmarkAcquireContended(b *testing.B) {
	ctx := context.Background()
	bud := New(Config{Capacity: 4096, MaxQueue: 1 << 20})
	b.SetParallelism(4)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := bud.Acquire(ctx, 4096)
			if err != nil {
				b.Fatal(err)
			}
			r.Release()
		}
	})
}

// BenchmarkRefusal is the cost of a 503: a full queue answers at once.
func BenchmarkRefusal(b *testing.B) {
	ctx := context.Background()
	bud := New(Config{Capacity: 10, MaxQueue: -1})
	hold, _ := bud.Acquire(ctx, 10)
	defer hold.Release()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bud.Acquire(ctx, 1); err == nil {
			b.Fatal("admitted")
		}
	}
}
