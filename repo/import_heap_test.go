package repo_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// heapRecords is the size of the repository the heap is measured on.
const heapRecords = 100_000

// maxImportHeap is the heap an import of heapRecords records must stay
// under.
const maxImportHeap = 64 << 20

// writeBigCAR writes a repository of n posts, signed by e's old key, to a
// file and returns its path and size.
func writeBigCAR(t testing.TB, e *importEnv, n int) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "repo.car")
	f, err := os.Create(path)
	require.NoError(t, err)
	w := bufio.NewWriter(f)
	_, err = repotest.WriteRepoCAR(context.Background(), w, e.did, e.oldKey, oldRev, n, func(i int) (string, []byte) {
		b, err := atdata.MarshalCBOR(postRecord(fmt.Sprintf("post number %d of a large repository, with some text", i)))
		if err != nil {
			panic(err)
		}
		return fmt.Sprintf("app.bsky.feed.post/3l%011d", i), b
	})
	require.NoError(t, err)
	require.NoError(t, w.Flush())
	st, err := f.Stat()
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return path, st.Size()
}

// heapSampler records the largest heap (live and not yet swept objects)
// seen while it runs.
type heapSampler struct {
	stop chan struct{}
	done sync.WaitGroup
	peak uint64
}

func startHeapSampler() *heapSampler {
	s := &heapSampler{stop: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() {
		metrics.Read(sample)
		s.peak = max(s.peak, sample[0].Value.Uint64())
	}
	read()
	s.done.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				read()
				return
			case <-tick.C:
				read()
			}
		}
	})
	return s
}

// Stop ends sampling and returns the peak.
func (s *heapSampler) Stop() uint64 {
	close(s.stop)
	s.done.Wait()
	return s.peak
}

// importBig imports the CAR at path into e's repository, sampling the
// heap, and returns the result and the peak heap.
func importBig(t testing.TB, e *importEnv, path string) (*repo.ImportResult, uint64) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	runtime.GC()
	s := startHeapSampler()
	res, err := e.engine.Import(context.Background(), e.did, f, repo.ImportOptions{})
	peak := s.Stop()
	require.NoError(t, err)
	return res, peak
}

// TestImportHeap imports a 100,000-record repository and checks that the
// heap stays under 64 MiB throughout: blocks go to Postgres as they
// stream, and the tree and records come back in bounded batches.
func TestImportHeap(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("builds a 100,000-record repository; the race detector's own memory would be measured too")
	}
	e := newImportEnv(t)
	path, size := writeBigCAR(t, e, heapRecords)
	res, peak := importBig(t, e, path)
	require.EqualValues(t, heapRecords, res.Records)
	t.Logf("imported %d records (%d blocks, %.1f MiB CAR) in %v (%.0f records/s); peak heap %.1f MiB",
		res.Records, res.Blocks, float64(size)/(1<<20), res.Elapsed.Round(time.Millisecond),
		float64(res.Records)/res.Elapsed.Seconds(), float64(peak)/(1<<20))
	require.Less(t, peak, uint64(maxImportHeap), "peak heap during the import")
}

// BenchmarkImport100k measures importing a 100,000-record repository.
func BenchmarkImport100k(b *testing.B) {
	e := newImportEnv(b)
	path, size := writeBigCAR(b, e, heapRecords)
	b.SetBytes(size)
	var peak uint64
	b.ResetTimer()
	for b.Loop() {
		_, p := importBig(b, e, path)
		peak = max(peak, p)
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
}
