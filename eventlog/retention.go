package eventlog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

// DefaultRetention is how long events are kept, and replayable, unless
// configured.
const DefaultRetention = 72 * time.Hour

// PrunerConfig tunes a Pruner. The zero value works.
type PrunerConfig struct {
	// Retention is how long events are kept (default DefaultRetention).
	Retention time.Duration
	// BatchSize is the most events deleted per statement (default 1000):
	// small deletes keep each transaction short and never hold up writers,
	// which only insert.
	BatchSize int
	// Interval is how often the pruner runs (default 10 minutes).
	Interval time.Duration
	Logger   *slog.Logger
}

// Pruner deletes events older than the retention window.
type Pruner struct {
	pool *pgxpool.Pool
	cfg  PrunerConfig
	log  *slog.Logger
}

// NewPruner returns a pruner of pool's event log.
func NewPruner(pool *pgxpool.Pool, cfg PrunerConfig) *Pruner {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Pruner{pool: pool, cfg: cfg, log: cfg.Logger.With("component", "firehose-pruner")}
}

// Run prunes every Interval until ctx ends. Several processes may run it:
// their deletes of the same rows simply find less to do.
func (p *Pruner) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		n, err := p.Prune(ctx, time.Now())
		if err != nil && ctx.Err() == nil {
			p.log.Warn("pruning events", "err", err)
		} else if n > 0 {
			p.log.Info("pruned events", "count", n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Prune deletes sequenced events created before now minus the retention
// window, one batch per statement, and returns how many it deleted.
func (p *Pruner) Prune(ctx context.Context, now time.Time) (int64, error) {
	cutoff := now.Add(-p.cfg.Retention)
	var total int64
	for {
		tag, err := p.pool.Exec(ctx, qPruneEvents, cutoff, p.cfg.BatchSize)
		if err != nil {
			return total, fmt.Errorf("pruning events before %s: %w", cutoff.Format(time.RFC3339), db.Translate(err))
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(p.cfg.BatchSize) {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}
