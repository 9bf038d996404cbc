package eventlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/cluster"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/metrics"
)

// NotifyChannel is the Postgres LISTEN channel on which the sequencer
// announces each batch (payload: the new last seq), so that processes other
// than the leader can wake their subscribers.
const NotifyChannel = "bulwark_sequenced"

// DefaultGather is SequencerConfig.Gather's default.
const DefaultGather = 50 * time.Millisecond

// SequencerConfig tunes the sequencer. The zero value works.
type SequencerConfig struct {
	// BatchSize is the most events numbered in one transaction (default 1000).
	BatchSize int
	// PollInterval is how often the leader looks for events committed by
	// other processes, which cannot wake it directly (default 20ms). Local
	// writers call Wake and are sequenced at once. Writers do not NOTIFY:
	// NOTIFY takes a database-wide lock at commit and would serialise them.
	PollInterval time.Duration
	// LeaderRetry is how often Run renews its lease and a follower tries to
	// take it (default: a sixth of LeaseTTL).
	LeaderRetry time.Duration
	// LeaseTTL is how long Run's lease lasts unrenewed (default
	// cluster.DefaultLeaseTTL): a leader that freezes is replaced within
	// LeaseTTL plus LeaderRetry.
	LeaseTTL time.Duration
	// Gather is how long the leader waits after a wake-up before numbering,
	// so that one sequencing transaction (and its WAL flush) serves many
	// commits instead of one each (default 50ms; negative = none). A batch
	// costs Postgres ~0.3 ms of CPU whatever its size, and its WAL flush
	// delays the writers' own: at 2 ms a single busy writer paid for one
	// batch per one or two commits, and 50 ms against 10 ms gave a lone
	// writer 2-4% more commits a second (repo BenchmarkCommitGatherAB).
	// 50 ms more of firehose latency is nothing to a relay.
	Gather time.Duration
	Logger *slog.Logger
}

// Sequencer gives committed events their public seq, in batches.
type Sequencer struct {
	pool *pgxpool.Pool
	cfg  SequencerConfig
	log  *slog.Logger
	wake chan struct{}

	mu        sync.Mutex
	listeners []func(lastSeq int64)

	// wokenAt is when the oldest wake-up not yet answered by a batch came
	// (unix nanoseconds; 0: none), for the sequencer lag metric.
	wokenAt atomic.Int64
	// countedAt is when the backlog was last counted (unix nanoseconds).
	countedAt atomic.Int64
}

// NewSequencer returns a sequencer for pool's database; call Run to start it.
func NewSequencer(pool *pgxpool.Pool, cfg SequencerConfig) *Sequencer {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.Gather == 0 {
		cfg.Gather = DefaultGather
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sequencer{
		pool: pool,
		cfg:  cfg,
		log:  cfg.Logger.With("component", "sequencer"),
		wake: make(chan struct{}, 1),
	}
}

// Wake tells the sequencer that events were committed. It never blocks.
func (s *Sequencer) Wake() {
	s.wokenAt.CompareAndSwap(0, time.Now().UnixNano())
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// OnSequenced registers fn to be called (from the sequencer goroutine) after
// each batch this process sequenced, with the new last seq. fn must not block.
func (s *Sequencer) OnSequenced(fn func(lastSeq int64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, fn)
}

// SequencerLease is the name of the lease under which one node of a
// cluster sequences.
const SequencerLease = "sequencer"

// Run sequences events until ctx ends, whenever this process holds the
// sequencer lease (a holder of its own; a server runs Lead under its
// node's leases instead). Other processes running it wait as followers
// and take over within the lease's expiry when the leader stops renewing.
func (s *Sequencer) Run(ctx context.Context) error {
	return cluster.RunSingleton(ctx, s.pool, SequencerLease, s.Lead, cluster.LeaseConfig{TTL: s.cfg.LeaseTTL, Tick: s.cfg.LeaderRetry, Logger: s.cfg.Logger})
}

// Lead sequences events while lease is held (until ctx ends). Every batch
// is fenced with the lease's epoch: a batch after another node took the
// lease over numbers nothing and ends Lead with db.ErrFenced.
func (s *Sequencer) Lead(ctx context.Context, lease cluster.Lease) error {
	s.log.Info("sequencer is leader", "epoch", lease.Epoch)
	tick := time.NewTicker(s.cfg.PollInterval)
	defer tick.Stop()
	for {
		for {
			n, err := s.sequence(ctx, &lease)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				return err
			}
			if n < s.cfg.BatchSize {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
			if s.cfg.Gather > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(s.cfg.Gather):
				}
			}
		case <-tick.C:
		}
	}
}

// SequenceBatch numbers up to BatchSize committed, unsequenced events in one
// transaction and returns how many it numbered, unfenced: for tests and
// for tools that run when no sequencer does.
func (s *Sequencer) SequenceBatch(ctx context.Context) (int, error) {
	return s.sequence(ctx, nil)
}

// sequence is one batch, fenced by lease when it is not nil.
func (s *Sequencer) sequence(ctx context.Context, lease *cluster.Lease) (int, error) {
	// Wake-ups from now on are the next batch's: their events may have
	// committed after this batch's snapshot.
	woken := s.wokenAt.Swap(0)
	var name *string
	var epoch *int64
	if lease != nil {
		name, epoch = &lease.Name, &lease.Epoch
	}
	var n, last int64
	err := db.Translate(s.pool.QueryRow(ctx, qSequenceBatch, s.cfg.BatchSize, name, epoch).Scan(&n, &last))
	if errors.Is(err, db.ErrNotFound) {
		metrics.SequencerPending.Set(0)
		return 0, nil
	}
	if err != nil {
		s.keepWake(woken)
		return 0, fmt.Errorf("sequencing events: %w", err)
	}
	s.observe(ctx, int(n), woken)
	s.mu.Lock()
	ls := s.listeners
	s.mu.Unlock()
	for _, fn := range ls {
		fn(last)
	}
	return int(n), nil
}

// observe records a batch of n events in the metrics: the lag since the
// wake-up it answered, and what is still waiting.
func (s *Sequencer) observe(ctx context.Context, n int, woken int64) {
	now := time.Now()
	if woken != 0 {
		metrics.SequencerLag.Set(now.Sub(time.Unix(0, woken)).Seconds())
	}
	if n < s.cfg.BatchSize {
		// The batch took every event committed before it began.
		metrics.SequencerPending.Set(0)
		return
	}
	// A full batch: more are waiting. Their wake-up is still unanswered.
	s.keepWake(woken)
	last := s.countedAt.Load()
	if now.UnixNano()-last < int64(time.Second) || !s.countedAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	var pending int64
	if err := s.pool.QueryRow(ctx, qCountUnsequenced, 10*s.cfg.BatchSize).Scan(&pending); err == nil {
		metrics.SequencerPending.Set(float64(pending))
	}
}

// keepWake puts back a wake-up time that a batch did not answer, unless an
// older one is there.
func (s *Sequencer) keepWake(woken int64) {
	if woken == 0 {
		return
	}
	for {
		cur := s.wokenAt.Load()
		if (cur != 0 && cur <= woken) || s.wokenAt.CompareAndSwap(cur, woken) {
			return
		}
	}
}

// RaiseSeq makes the next seq greater than floor (for a relay whose cursor is
// ahead of this server after a restore), through q. It returns the new last
// seq.
func RaiseSeq(ctx context.Context, q db.DBTX, floor int64) (int64, error) {
	var last int64
	if err := q.QueryRow(ctx, qRaiseLastSeq, floor).Scan(&last); err != nil {
		return 0, fmt.Errorf("raising seq: %w", db.Translate(err))
	}
	return last, nil
}
