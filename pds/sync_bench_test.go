package pds

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/limits"
	"github.com/bulwark-pds/bulwark/repo"
)

// benchRecords is the size of the repository BenchmarkGetRepo exports.
const benchRecords = 100_000

// benchClients stream the export at once.
const benchClients = 8

// maxStreamHeap is the bound the benchmark holds the server's heap to while the
// clients stream.
const maxStreamHeap = 64 << 20

// BenchmarkGetRepo builds a 100,000-record repository (500 commits of 200
// creates), then has 8 clients download it with getRepo at once, per
// iteration, sampling the process heap throughout. It checks once that the
// export loads with indigo and its MST matches the record index.
//
//	go test ./pds -run '^$' -bench BenchmarkGetRepo -benchtime 3x
func BenchmarkGetRepo(b *testing.B) {
	ctx := context.Background()
	// Every client streams at once: no export-slot queue in front.
	// Unpaced: the benchmark measures the export itself.
	sb := syncSetup(b, syncOptions{exportSlots: benchClients, configure: func(c *config.Config) { c.ExportRate = 0 }})
	did := sb.newAccount(b, "big", account.StatusActive)

	start := time.Now()
	// A writer engine of its own, unreachable once the repository is
	// built, so that its tree cache does not count as the server's heap.
	writer := repo.New(sb.pool, sb.keys, nil, repo.Config{})
	for c := 0; c < benchRecords/limits.MaxCommitOps; c++ {
		writes := make([]repo.Write, 0, limits.MaxCommitOps)
		for i := range limits.MaxCommitOps {
			n := c*limits.MaxCommitOps + i
			writes = append(writes, repo.Write{
				Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
				RKey: syntax.RecordKey(fmt.Sprintf("r%07d", n)), Record: postRecord(fmt.Sprintf("post number %d", n)),
			})
		}
		_, err := writer.Apply(ctx, did, writes, nil)
		require.NoError(b, err)
	}
	b.Logf("built %d records in %s", benchRecords, time.Since(start).Round(time.Millisecond))

	getURL := sb.url + "/xrpc/com.atproto.sync.getRepo?" + url.Values{"did": {did.String()}}.Encode()
	download := func(w io.Writer) int64 {
		resp, err := http.Get(getURL)
		require.NoError(b, err)
		defer resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode)
		n, err := io.Copy(w, resp.Body)
		require.NoError(b, err)
		return n
	}

	// The measurement is a sub-benchmark so that the repository above is
	// built once, not once per b.N the framework tries.
	b.Run(fmt.Sprintf("clients=%d", benchClients), func(b *testing.B) {
		runtime.GC()
		base := heapBytes()
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			t := time.NewTicker(2 * time.Millisecond)
			defer t.Stop()
			for {
				if h := heapBytes(); h > peak.Load() {
					peak.Store(h)
				}
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		}()

		var size atomic.Int64
		b.ResetTimer()
		for range b.N {
			var wg sync.WaitGroup
			for range benchClients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					size.Store(download(io.Discard))
				}()
			}
			wg.Wait()
		}
		b.StopTimer()
		close(stop)
		<-sampled

		b.SetBytes(size.Load() * benchClients)
		b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
		b.ReportMetric(float64(base)/(1<<20), "base-heap-MiB")
		b.ReportMetric(float64(size.Load())/(1<<20), "car-MiB")
		b.Logf("CAR %d bytes; heap before %d MiB, peak while %d clients streamed %d MiB",
			size.Load(), base>>20, benchClients, peak.Load()>>20)
		if peak.Load() >= maxStreamHeap {
			b.Errorf("peak heap %d MiB while streaming; the bound is %d MiB", peak.Load()>>20, maxStreamHeap>>20)
		}
	})

	// Correctness, once, outside the measurement: indigo loads the export
	// and its MST is exactly the record index.
	pr, pw := io.Pipe()
	go func() { download(pw); pw.Close() }()
	requireCARMatchesIndex(b, pr, sb.recordIndex(b, did))
}

var heapSample = []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}

// heapBytes is the memory held by heap objects, live or not yet swept
// (runtime.MemStats.HeapAlloc), read without stopping the world.
func heapBytes() uint64 {
	s := make([]metrics.Sample, 1)
	copy(s, heapSample)
	metrics.Read(s)
	return s[0].Value.Uint64()
}
