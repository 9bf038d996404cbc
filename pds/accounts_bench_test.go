package pds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// createRecord throughput over HTTP on loopback, against a Postgres cluster
// on disk with fsync and synchronous_commit on (the test clusters run with
// them off), with the sequencer running as in `bulwark serve`. Run:
//
//	go test ./pds -run '^$' -bench CreateRecordHTTP -benchtime 3000x

// benchPG is the durable cluster the benchmarks run on (dbtest.Durable).
var benchPG *db.Managed

func durablePool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	pool, m := dbtest.Durable(b)
	benchPG = m
	// The collector as the server runs it (cmd/bulwark serve).
	config.ApplyGC(config.DefaultGCPercent)
	return pool
}

// benchCPU returns the CPU time used so far by this process (server and
// clients) and by the benchmark's Postgres.
func benchCPU(b *testing.B) (self, pg time.Duration) {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	pg, err := benchPG.ServerCPU()
	require.NoError(b, err)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), pg
}

func BenchmarkCreateRecordHTTP(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			e := newAccountEnv(b, envOptions{pool: durablePool(b), sequence: true})
			users := make([]*user, clients)
			for i := range users {
				users[i] = e.createUser(b)
			}
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			bodies := make([][]byte, clients)
			for i, u := range users {
				bodies[i], _ = json.Marshal(map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("benchmark post")})
			}
			var mu sync.Mutex
			var lat []time.Duration
			var next atomic.Int64
			var wg sync.WaitGroup
			self0, pg0 := benchCPU(b)
			b.ResetTimer()
			start := time.Now()
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []time.Duration
					for next.Add(1) <= int64(b.N) {
						req, _ := http.NewRequest(http.MethodPost, e.url+"/xrpc/com.atproto.repo.createRecord", bytes.NewReader(bodies[c]))
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Authorization", "Bearer "+users[c].access)
						t0 := time.Now()
						resp, err := hc.Do(req)
						if err != nil {
							b.Error(err)
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							b.Errorf("status %d", resp.StatusCode)
							return
						}
						mine = append(mine, time.Since(t0))
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if len(lat) == 0 {
				return
			}
			slices.Sort(lat)
			b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "records/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			self1, pg1 := benchCPU(b)
			b.ReportMetric(float64((self1-self0).Microseconds())/float64(len(lat)), "go-cpu-µs/op")
			b.ReportMetric(float64((pg1-pg0).Microseconds())/float64(len(lat)), "pg-cpu-µs/op")
		})
	}
}
