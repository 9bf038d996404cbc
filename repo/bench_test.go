package repo

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/limits"
)

// The benchmarks run against a cluster on disk with fsync and
// synchronous_commit on (the test clusters run with them off), so commit
// figures include a real WAL flush. Run:
//
//	go test ./repo -run '^$' -bench . -benchtime 2000x
//
// Knobs for experiments: BENCH_GATHER (the sequencer's gather wait, e.g.
// 50ms), BENCH_GROUP_LEADERS (group commit leaders; -1 turns grouping
// off), BENCH_NOWAKE (the sequencer polls instead of being woken),
// BENCH_PG_SETTINGS (extra Postgres settings, dbtest.Durable) and
// BENCH_PG_STATS (below).

// benchPG is the durable cluster the benchmarks run on (dbtest.Durable).
var benchPG *db.Managed

func benchSetup(b *testing.B, cfg Config) *bundle {
	b.Helper()
	ctx := context.Background()
	pool, m := dbtest.Durable(b)
	benchPG = m
	// The collector as the server runs it (cmd/bulwark serve).
	config.ApplyGC(config.DefaultGCPercent)
	keys := &testKeys{keys: map[syntax.DID]*atcrypto.PrivateKeyK256{}}
	var gather time.Duration
	if v := os.Getenv("BENCH_GATHER"); v != "" {
		gather, _ = time.ParseDuration(v)
	}
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Gather: gather})
	bctx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	seqDone := make(chan struct{})
	go func() { defer close(seqDone); _ = seq.Run(bctx) }()
	if cfg.counters == nil {
		cfg.counters = newCounters()
	}
	if v := os.Getenv("BENCH_GROUP_LEADERS"); v != "" && cfg.groupLeaders == 0 {
		cfg.groupLeaders, _ = strconv.Atoi(v)
	}
	var waker Waker = seq
	if os.Getenv("BENCH_NOWAKE") != "" {
		waker = nil
	}
	return &bundle{pool: pool, engine: New(pool, keys, waker, cfg), keys: keys, seq: seq, log: eventlog.NewLog(pool),
		stopSeq: func() { cancel(); <-seqDone }}
}

// latencies collects per-commit durations and reports commits/s, p50, p99.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, elapsed time.Duration) {
	slices.Sort(l.d)
	if len(l.d) == 0 {
		return
	}
	b.ReportMetric(float64(len(l.d))/elapsed.Seconds(), "commits/s")
	b.ReportMetric(float64(l.d[len(l.d)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds())/1000, "p99-ms")
}

func runCommitBench(b *testing.B, writers int, repos int, cfg Config) {
	bb := benchSetup(b, cfg)
	dids := make([]syntax.DID, repos)
	for i := range dids {
		dids[i] = bb.newRepo(b, i)
	}
	ctx := context.Background()
	var lat latencies
	var next atomic.Int64
	cpu0 := sampleCPU(b)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			did := dids[w%repos]
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				_, err := bb.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("benchmark post"))}, nil)
				if err != nil {
					b.Error(err)
					return
				}
				lat.add(time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	lat.report(b, elapsed)
	cpu0.reportSince(b)
	b.ReportMetric(100*counterValue(b, bb.engine.counters.groupedCommits)/float64(b.N), "grouped-%")
	if os.Getenv("BENCH_PG_STATS") != "" {
		printStatementStats(b, bb.pool)
	}
}

// cpuSample is CPU time used so far by this process and by the benchmark
// cluster.
type cpuSample struct{ self, pg time.Duration }

func sampleCPU(b *testing.B) cpuSample {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	pg, err := benchPG.ServerCPU()
	require.NoError(b, err)
	return cpuSample{self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), pg: pg}
}

// reportSince reports the CPU this process and the cluster used per op
// since c was sampled.
func (c cpuSample) reportSince(b *testing.B) {
	now := sampleCPU(b)
	b.ReportMetric(float64((now.self-c.self).Microseconds())/float64(b.N), "go-cpu-µs/op")
	b.ReportMetric(float64((now.pg-c.pg).Microseconds())/float64(b.N), "pg-cpu-µs/op")
}

// printStatementStats prints where the server's time went, per statement,
// from pg_stat_statements (BENCH_PG_SETTINGS must preload it).
func printStatementStats(b *testing.B, pool *pgxpool.Pool) {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		b.Log(err)
		return
	}
	var avgBody, avgStored float64
	if err := pool.QueryRow(ctx, "SELECT avg(octet_length(body)), avg(pg_column_size(body)) FROM events").Scan(&avgBody, &avgStored); err == nil {
		fmt.Printf("event body: %.0f bytes on average, %.0f stored\n", avgBody, avgStored)
	}
	var walRecords, walBytes, walWrites, walSyncs int64
	if err := pool.QueryRow(ctx, "SELECT wal_records, wal_bytes::bigint, wal_write, wal_sync FROM pg_stat_wal").Scan(&walRecords, &walBytes, &walWrites, &walSyncs); err == nil {
		fmt.Printf("WAL since the cluster started: %d records, %d bytes, %d writes, %d syncs\n", walRecords, walBytes, walWrites, walSyncs)
	}
	rows, err := pool.Query(ctx, `SELECT calls, round(total_exec_time::numeric, 1), round((total_exec_time/nullif(calls, 0)*1000)::numeric, 1),
		round(total_plan_time::numeric, 1), coalesce((wal_bytes/nullif(calls, 0))::bigint, 0), left(regexp_replace(query, '\s+', ' ', 'g'), 90)
		FROM pg_stat_statements WHERE calls > 0 AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time DESC LIMIT 25`)
	if err != nil {
		b.Log(err)
		return
	}
	defer rows.Close()
	fmt.Printf("%8s %10s %8s %8s %8s  %s\n", "calls", "exec ms", "µs/call", "plan ms", "wal B/call", "query")
	for rows.Next() {
		var calls, walRecs int64 // walRecs: WAL bytes per call
		var total, per, plan float64
		var q string
		if err := rows.Scan(&calls, &total, &per, &plan, &walRecs, &q); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%8d %10.1f %8.1f %8.1f %8d  %s\n", calls, total, per, plan, walRecs, q)
	}
	if err := rows.Err(); err != nil {
		fmt.Println(err)
	}
}

func BenchmarkCommitOneWriter(b *testing.B) { runCommitBench(b, 1, 1, Config{}) }

func BenchmarkCommit16Writers16Repos(b *testing.B) { runCommitBench(b, 16, 16, Config{}) }

func BenchmarkCommit8WritersOneRepo(b *testing.B) { runCommitBench(b, 8, 1, Config{}) }

// BenchmarkExport100k builds a 100,000-record repository and streams its
// CAR, reporting the time of one export and the peak heap in use during it.
func BenchmarkExport100k(b *testing.B) {
	bb := benchSetup(b, Config{})
	ctx := context.Background()
	did := bb.newRepo(b, 1)
	for i := 0; i < 100_000; i += limits.MaxCommitOps {
		writes := make([]Write, limits.MaxCommitOps)
		for j := range writes {
			writes[j] = create("app.bsky.feed.post", "", post(fmt.Sprintf("record %d with some text to look like a post", i+j)))
		}
		_, err := bb.engine.Apply(ctx, did, writes, nil)
		require.NoError(b, err)
	}
	// Export from a server that has not just written the repo: a fresh
	// engine, with the writer's tree cache released.
	exporter := New(bb.pool, bb.keys, nil, Config{})
	bb.engine = nil
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	b.ResetTimer()
	for range b.N {
		peak := watchHeap()
		cw := &countingWriter{}
		start := time.Now()
		require.NoError(b, exporter.ExportCAR(ctx, did, "", cw))
		b.ReportMetric(time.Since(start).Seconds(), "s/export")
		b.ReportMetric(float64(cw.n)/(1<<20), "MiB-car")
		p := peak()
		b.ReportMetric(float64(p)/(1<<20), "peak-heap-MiB")
		// What the export adds over the heap in use before it started.
		b.ReportMetric(float64(p-min(p, base.HeapInuse))/(1<<20), "export-heap-MiB")
	}
}

// watchHeap samples HeapInuse until the returned func is called, which
// reports the peak.
func watchHeap() func() uint64 {
	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(stop); <-done; return peak.Load() }
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

var _ io.Writer = (*countingWriter)(nil)

// BenchmarkCommit16Writers16Repos_NoGroup stores every commit in its own
// transaction: what group commit (group.go) saves.
func BenchmarkCommit16Writers16Repos_NoGroup(b *testing.B) {
	runCommitBench(b, 16, 16, Config{groupLeaders: -1})
}
