package repo

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// BenchmarkPostgresRoundTrip measures the floor under every commit on this
// machine: one round trip, and one small transaction with its WAL flush.
func BenchmarkPostgresRoundTrip(b *testing.B) {
	bb := benchSetup(b, Config{})
	ctx := context.Background()
	b.Run("select1", func(b *testing.B) {
		for range b.N {
			if _, err := bb.pool.Exec(ctx, "SELECT 1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	_, _ = bb.pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS rt (id bigserial primary key, v bytea)")
	b.Run("tx-insert-commit", func(b *testing.B) {
		for range b.N {
			err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO rt (v) VALUES ($1)", []byte("x"))
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// phaseTracer times each statement and batch a commit sends.
type phaseTracer struct {
	mu  sync.Mutex
	sum map[string]time.Duration
	n   map[string]int
}

type ptKey struct{}

func (p *phaseTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, ptKey{}, [2]any{time.Now(), d.SQL})
}

func (p *phaseTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	v := ctx.Value(ptKey{}).([2]any)
	sql := v[1].(string)
	if len(sql) > 40 {
		sql = sql[:40]
	}
	p.mu.Lock()
	p.sum[sql] += time.Since(v[0].(time.Time))
	p.n[sql]++
	p.mu.Unlock()
}

func (p *phaseTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, ptKey{}, [2]any{time.Now(), "BATCH"})
}
func (p *phaseTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {}
func (p *phaseTracer) TraceBatchEnd(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchEndData) {
	p.TraceQueryEnd(ctx, c, pgx.TraceQueryEndData{})
}

// BenchmarkPhasesOfCommit prints where one commit's time goes, per round
// trip (stderr): the profile behind the commit figures in BENCHMARKS.md.
func BenchmarkPhasesOfCommit(b *testing.B) {
	bb := benchSetup(b, Config{})
	ctx := context.Background()
	cfg := bb.pool.Config()
	pt := &phaseTracer{sum: map[string]time.Duration{}, n: map[string]int{}}
	cfg.ConnConfig.Tracer = pt
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	bb.engine.pool = pool
	did := bb.newRepo(b, 1)
	t0 := time.Now()
	for range b.N {
		_, err := bb.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("x"))}, nil)
		require.NoError(b, err)
	}
	total := time.Since(t0)
	for k, v := range pt.sum {
		fmt.Fprintf(os.Stderr, "%-42q n=%d avg=%v\n", k, pt.n[k], v/time.Duration(pt.n[k]))
	}
	fmt.Fprintf(os.Stderr, "total per commit %v\n", total/time.Duration(b.N))
}
