package repo

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/eventlog"
)

// On this VM separate runs of the same code differ by up to ±25% (the
// hypervisor's steal comes and goes), so a change of a few percent shows
// only when its two sides share the same minutes. runInterleavedAB runs
// writers committing (each to its own repo) without pause, and switches
// between two variants every 400 ms (use sets one up; it is also called
// for variant 0 before the writers start), b.N blocks in all; each commit counts
// for the variant it started and ended in. It prints commits/s and
// latencies per variant.
func runInterleavedAB(b *testing.B, writers int, names [2]string, use func(bb *bundle, variant int)) {
	bb := benchSetup(b, Config{})
	ctx := context.Background()
	dids := make([]syntax.DID, writers)
	for i := range dids {
		dids[i] = bb.newRepo(b, i)
	}
	use(bb, 0) // set up before the writers start
	const between = -1
	var variant atomic.Int32
	variant.Store(between)
	var mu sync.Mutex
	var lat [2][]time.Duration
	var dur [2]time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				v := variant.Load()
				t0 := time.Now()
				_, err := bb.engine.Apply(ctx, dids[w], []Write{create("app.bsky.feed.post", "", post("benchmark post"))}, nil)
				if err != nil {
					b.Error(err)
					return
				}
				if v != between && variant.Load() == v {
					mu.Lock()
					lat[v] = append(lat[v], time.Since(t0))
					mu.Unlock()
				}
			}
		})
	}
	for i := range b.N {
		v := i % 2
		use(bb, v)
		variant.Store(int32(v))
		t0 := time.Now()
		time.Sleep(400 * time.Millisecond)
		variant.Store(between)
		dur[v] += time.Since(t0)
	}
	close(stop)
	wg.Wait()
	for v := range 2 {
		if len(lat[v]) == 0 || b.N < 2 {
			continue
		}
		slices.Sort(lat[v])
		var sum time.Duration
		for _, d := range lat[v] {
			sum += d
		}
		n := len(lat[v])
		fmt.Fprintf(os.Stderr, "%-12s %6.0f commits/s  p50 %v  mean %v  p99 %v  (%d commits)\n", names[v],
			float64(n)/dur[v].Seconds(), lat[v][n/2].Round(time.Microsecond), (sum / time.Duration(n)).Round(time.Microsecond),
			lat[v][n*99/100].Round(time.Microsecond), n)
	}
}

// BenchmarkCommitGCPercentAB compares Go's default collector target with
// the server's (config.DefaultGCPercent), interleaved. BENCH_AB_WRITERS
// sets the writers (default 1). Run with -benchtime 40x (16 s).
func BenchmarkCommitGCPercentAB(b *testing.B) {
	writers, _ := strconv.Atoi(os.Getenv("BENCH_AB_WRITERS"))
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	runInterleavedAB(b, max(writers, 1), [2]string{"GOGC=100", fmt.Sprintf("GOGC=%d", config.DefaultGCPercent)}, func(_ *bundle, v int) {
		debug.SetGCPercent([2]int{100, config.DefaultGCPercent}[v])
	})
}

// BenchmarkCommitGatherAB compares sequencer gather waits, interleaved: 10
// ms against eventlog.DefaultGather, or BENCH_AB_GATHER. BENCH_AB_WRITERS
// sets the writers (default 1). Each block starts a sequencer of its own
// (the bundle's is stopped), so the leadership passes at each switch.
func BenchmarkCommitGatherAB(b *testing.B) {
	writers, _ := strconv.Atoi(os.Getenv("BENCH_AB_WRITERS"))
	gather := eventlog.DefaultGather
	if v := os.Getenv("BENCH_AB_GATHER"); v != "" {
		gather, _ = time.ParseDuration(v)
	}
	gathers := [2]time.Duration{10 * time.Millisecond, gather}
	var stop func()
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	var current atomic.Pointer[eventlog.Sequencer]
	runInterleavedAB(b, max(writers, 1), [2]string{"gather " + gathers[0].String(), "gather " + gathers[1].String()}, func(bb *bundle, v int) {
		if stop == nil { // the first call, before the writers start
			stop = bb.stopSeq
			bb.engine.waker = wakeFunc(func() { current.Load().Wake() })
		}
		stop()
		seq := eventlog.NewSequencer(bb.pool, eventlog.SequencerConfig{Gather: gathers[v], LeaderRetry: 5 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = seq.Run(ctx) }()
		stop = func() { cancel(); <-done }
		current.Store(seq)
	})
}

// wakeFunc is a Waker.
type wakeFunc func()

func (f wakeFunc) Wake() { f() }
