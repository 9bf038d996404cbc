package budget

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"time"
)

// HeapCost is what one operation cost in heap, as measured by MeasureHeap.
// Divide by the operation's input or output size to get the factor a
// reservation is sized with ("decoding holds ~11x the file size").
type HeapCost struct {
	// Peak is the highest heap (live and not yet collected objects) seen
	// while the operation ran, above the level before it started. It is
	// sampled, so a very short spike can be missed; run the operation on
	// inputs big enough to take milliseconds.
	Peak uint64
	// Retained is the heap still live after the operation, through its
	// result, once garbage is collected.
	Retained uint64
	// Allocated is every byte the operation allocated, garbage included:
	// the pressure it puts on the collector.
	Allocated uint64
}

const heapObjectsMetric = "/memory/classes/heap/objects:bytes"

// MeasureHeap runs op and reports its heap cost. It forces garbage
// collections, so call it from a benchmark or a measuring tool, never on a
// serving path, and not concurrently with other work if the figures are to
// mean anything. The value op returns is kept alive until Retained has been
// read.
//
// Peak is the figure reservations are sized from: garbage counts, because
// until the collector runs it occupies memory just as live data does.
func MeasureHeap(op func() any) HeapCost {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	base := heapObjects()

	stop := make(chan struct{})
	var peak uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Microsecond)
		defer t.Stop()
		for {
			if h := heapObjects(); h > peak {
				peak = h
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()

	result := op()

	close(stop)
	wg.Wait()
	if h := heapObjects(); h > peak {
		peak = h
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	runtime.GC()
	var retained runtime.MemStats
	runtime.ReadMemStats(&retained)
	runtime.KeepAlive(result)

	c := HeapCost{Allocated: after.TotalAlloc - before.TotalAlloc}
	if peak > base {
		c.Peak = peak - base
	}
	if retained.HeapAlloc > before.HeapAlloc {
		c.Retained = retained.HeapAlloc - before.HeapAlloc
	}
	// A peak below what is retained means the sampler missed the top.
	c.Peak = max(c.Peak, c.Retained)
	return c
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: heapObjectsMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
