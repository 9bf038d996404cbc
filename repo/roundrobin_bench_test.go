package repo

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// BenchmarkRoundRobin is the repository engine's part of a cluster behind
// a balancer: 8 writers, each on its own repository of 3,000 records,
// their commits sent to one engine, to three engines in turn (a
// round-robin balancer over three nodes: a repository's consecutive
// commits land on different engines, each caching its own trees), or to
// three engines with each repository kept on one (affinity). The engines
// share the process and the database as nodes on one machine would share
// the cores. plans/op is the commits worked out and signed per commit
// stored (more than 1: work redone after a refusal), checks/op the reads
// of a root before a commit, refreshes/op the cached trees caught up.
//
//	go test ./repo -run '^$' -bench RoundRobin -benchtime 2000x
func BenchmarkRoundRobin(b *testing.B) {
	for _, bc := range []struct {
		name     string
		engines  int
		affinity bool
	}{{"engines=1", 1, false}, {"engines=3-roundrobin", 3, false}, {"engines=3-affinity", 3, true}} {
		b.Run(bc.name, func(b *testing.B) { runRoundRobin(b, bc.engines, bc.affinity) })
	}
}

func runRoundRobin(b *testing.B, n int, affinity bool) {
	const writers, records = 8, 3000
	bb := benchSetup(b, Config{})
	ctx := context.Background()
	engines := []*Engine{bb.engine}
	for range n - 1 {
		engines = append(engines, New(bb.pool, bb.keys, bb.seq, Config{counters: newCounters()}))
	}
	dids := make([]syntax.DID, writers)
	for i := range dids {
		dids[i] = bb.newRepo(b, int(time.Now().UnixNano()%1e9)*100+i)
		for j := 0; j < records; j += 200 {
			writes := make([]Write, 200)
			for k := range writes {
				writes[k] = create("app.bsky.feed.post", "", post(fmt.Sprint("seed ", j+k)))
			}
			if _, err := bb.engine.Apply(ctx, dids[i], writes, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	before := make([]counts, n)
	for i, e := range engines {
		before[i] = e.countsNow(b)
	}
	if os.Getenv("BENCH_PG_STATS") != "" {
		_, _ = bb.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
		_, _ = bb.pool.Exec(ctx, "SELECT pg_stat_statements_reset()")
	}
	var lat latencies
	var next, turn atomic.Int64
	cpu0 := sampleCPU(b)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				e := engines[int(turn.Add(1))%n]
				if affinity {
					e = engines[w%n]
				}
				t0 := time.Now()
				if _, err := e.Apply(ctx, dids[w], []Write{create("app.bsky.feed.post", "", post("benchmark post"))}, nil); err != nil {
					b.Error(err)
					return
				}
				lat.add(time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	lat.report(b, elapsed)
	cpu0.reportSince(b)
	var d counts
	for i, e := range engines {
		c := e.countsNow(b)
		d.plans += c.plans - before[i].plans
		d.refreshes += c.refreshes - before[i].refreshes
		d.checks += c.checks - before[i].checks
	}
	b.ReportMetric(d.plans/float64(b.N), "plans/op")
	b.ReportMetric(d.checks/float64(b.N), "checks/op")
	b.ReportMetric(d.refreshes/float64(b.N), "refreshes/op")
	if os.Getenv("BENCH_PG_STATS") != "" {
		printStatementStats(b, bb.pool)
	}
}
