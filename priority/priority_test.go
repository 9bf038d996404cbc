package priority

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// forever is a MaxPause no test waits out: a Yield under it ends only
// because the foreground work left or the context ended.
const forever = time.Hour

// yieldAsync runs Yield in a goroutine and returns its result channel.
func yieldAsync(ctx context.Context, g *Gate) <-chan error {
	done := make(chan error, 1)
	go func() { done <- g.Yield(ctx) }()
	return done
}

// waitingFor waits until n Yield calls are blocked in g.
func waitingFor(t *testing.T, g *Gate, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return g.Stats().Waiting == n }, 10*time.Second, time.Millisecond)
}

func requirePending(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Yield returned (%v) while foreground work was in flight", err)
	default:
	}
}

func TestYieldWithNothingInFlightReturnsAtOnce(t *testing.T) {
	t.Parallel()
	g := New(Config{MaxPause: forever})
	require.NoError(t, g.Yield(context.Background()))
	// Nothing to wait for: even an ended context is no reason to stop.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, g.Yield(ctx))
	leave := g.Enter()
	leave()
	require.NoError(t, g.Yield(context.Background()))
	st := g.Stats()
	require.Zero(t, st.Waits)
	require.Zero(t, st.InFlight)
	require.EqualValues(t, 1, st.Entered)
}

func TestYieldWaitsUntilForegroundLeaves(t *testing.T) {
	t.Parallel()
	var pauses, timedOuts atomic.Int64
	g := New(Config{MaxPause: forever, OnPause: func(_ time.Duration, timedOut bool) {
		pauses.Add(1)
		if timedOut {
			timedOuts.Add(1)
		}
	}})
	leave1 := g.Enter()
	leave2 := g.Enter()
	done := yieldAsync(context.Background(), g)
	waitingFor(t, g, 1)
	requirePending(t, done)

	// One of two writes done: still in flight.
	leave1()
	require.EqualValues(t, 1, g.Stats().InFlight)
	requirePending(t, done)
	require.EqualValues(t, 1, g.Stats().Waiting)

	leave2()
	require.NoError(t, <-done)
	st := g.Stats()
	require.Zero(t, st.InFlight)
	require.Zero(t, st.Waiting)
	require.EqualValues(t, 1, st.Waits)
	require.Zero(t, st.Timeouts)
	require.Positive(t, st.Paused)
	require.EqualValues(t, 1, pauses.Load())
	require.Zero(t, timedOuts.Load())
}

func TestYieldReleasesEveryWaiter(t *testing.T) {
	t.Parallel()
	g := New(Config{MaxPause: forever})
	leave := g.Enter()
	var dones []<-chan error
	for range 5 {
		dones = append(dones, yieldAsync(context.Background(), g))
	}
	waitingFor(t, g, 5)
	leave()
	for _, d := range dones {
		require.NoError(t, <-d)
	}
	require.EqualValues(t, 5, g.Stats().Waits)
}

func TestMaxPauseBoundsTheWait(t *testing.T) {
	t.Parallel()
	var timedOuts atomic.Int64
	g := New(Config{MaxPause: time.Millisecond, OnPause: func(_ time.Duration, timedOut bool) {
		if timedOut {
			timedOuts.Add(1)
		}
	}})
	leave := g.Enter()
	defer leave()
	// The foreground work never leaves; background work still goes on,
	// one Yield per chunk.
	for range 3 {
		require.NoError(t, g.Yield(context.Background()))
	}
	st := g.Stats()
	require.EqualValues(t, 3, st.Waits)
	require.EqualValues(t, 3, st.Timeouts)
	require.EqualValues(t, 3, timedOuts.Load())
	require.EqualValues(t, 1, st.InFlight)
}

func TestYieldEndsWithItsContext(t *testing.T) {
	t.Parallel()
	g := New(Config{MaxPause: forever})
	leave := g.Enter()
	defer leave()
	ctx, cancel := context.WithCancel(context.Background())
	done := yieldAsync(ctx, g)
	waitingFor(t, g, 1)
	requirePending(t, done)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	st := g.Stats()
	require.Zero(t, st.Waiting)
	require.Zero(t, st.Timeouts)
	require.EqualValues(t, 1, st.InFlight)
}

func TestNegativeMaxPauseNeverWaits(t *testing.T) {
	t.Parallel()
	g := New(Config{MaxPause: -1})
	require.Zero(t, g.MaxPause())
	leave := g.Enter()
	defer leave()
	require.NoError(t, g.Yield(context.Background()))
	st := g.Stats()
	require.Zero(t, st.Waits)
	require.EqualValues(t, 1, st.InFlight, "foreground work is counted all the same")
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, DefaultMaxPause, New(Config{}).MaxPause())
	require.Equal(t, 7*time.Millisecond, New(Config{MaxPause: 7 * time.Millisecond}).MaxPause())
}

func TestNilGate(t *testing.T) {
	t.Parallel()
	var g *Gate
	leave := g.Enter()
	leave()
	require.NoError(t, g.Yield(context.Background()))
	require.Zero(t, g.Stats())
	require.Zero(t, g.MaxPause())
}

func TestLeaveTwiceCountsOnce(t *testing.T) {
	t.Parallel()
	g := New(Config{MaxPause: forever})
	leave := g.Enter()
	other := g.Enter()
	leave()
	leave()
	require.EqualValues(t, 1, g.Stats().InFlight)
	done := yieldAsync(context.Background(), g)
	waitingFor(t, g, 1)
	requirePending(t, done)
	other()
	require.NoError(t, <-done)
	require.Zero(t, g.Stats().InFlight)
}

// TestNoLostWakeup churns foreground work from many goroutines while
// background goroutines yield in a loop under a MaxPause no test waits
// out. When the churn stops, every yielder must be released: a crossing
// of zero whose reconcile left the idle channel open would leave one
// blocked (and the test hanging). At the end the gate is idle.
func TestNoLostWakeup(t *testing.T) {
	t.Parallel()
	g := New(Config{MaxPause: forever})
	var stop atomic.Bool
	var yielders sync.WaitGroup
	var yields atomic.Int64
	for range 4 {
		yielders.Go(func() {
			for !stop.Load() {
				assert.NoError(t, g.Yield(context.Background()))
				yields.Add(1)
			}
		})
	}
	var churn sync.WaitGroup
	for range 8 {
		churn.Go(func() {
			for range 2000 {
				leave := g.Enter()
				if yields.Load()%3 == 0 {
					leave2 := g.Enter()
					leave2()
				}
				leave()
			}
		})
	}
	churn.Wait()
	stop.Store(true)
	yielders.Wait()

	st := g.Stats()
	require.Zero(t, st.InFlight)
	require.Zero(t, st.Waiting)
	require.Zero(t, st.Timeouts)
	g.mu.Lock()
	require.True(t, isClosed(g.idle), "idle must be closed with nothing in flight")
	g.mu.Unlock()
	// And a fresh piece of foreground work still holds a yielder back.
	leave := g.Enter()
	done := yieldAsync(context.Background(), g)
	waitingFor(t, g, 1)
	requirePending(t, done)
	leave()
	require.NoError(t, <-done)
}
