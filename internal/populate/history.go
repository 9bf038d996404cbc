package populate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/repo"
)

// historyFlush is how many commits go by between updates of the history
// count a resumed run starts from.
const historyFlush = 500

// History makes n commits through the repository engine, as a server's
// createRecord makes them: each creates one record (like, post, follow or
// repost, as ShapeOf's mix) in an account drawn at random from the
// realistic ones among the first cfg.Accounts, and appends its #commit event, which a sequencer numbers
// as the server's would. It is the firehose history a relay backfills.
// writers commit at once (default 8). The server must not be running.
func History(ctx context.Context, cfg Config, n, writers int) (int64, error) {
	if err := cfg.defaults(); err != nil {
		return 0, err
	}
	if writers <= 0 {
		writers = 8
	}
	seq := eventlog.NewSequencer(cfg.Pool, eventlog.SequencerConfig{Gather: -1, Logger: cfg.Logger})
	sctx, stopSeq := context.WithCancel(ctx)
	var seqDone sync.WaitGroup
	seqDone.Go(func() { _ = seq.Run(sctx) })
	defer func() { stopSeq(); seqDone.Wait() }()
	engine := repo.New(cfg.Pool, cfg.Keys, seq, repo.Config{Logger: cfg.Logger})

	var made, pending atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(cfg.Seed^uint64(time.Now().UnixNano()), uint64(w)))
			for made.Add(1) <= int64(n) {
				if err := historyCommit(ctx, &cfg, engine, r); err != nil {
					errs <- err
					return
				}
				if pending.Add(1)%historyFlush == 0 {
					if _, err := cfg.Pool.Exec(ctx, qAddHistory, historyFlush); err != nil {
						errs <- db.Translate(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return pending.Load(), err
	}
	// Number what the running sequencer has not yet, so that the server
	// starts with none waiting.
	for {
		k, err := seq.SequenceBatch(ctx)
		if err != nil {
			return pending.Load(), err
		}
		if k == 0 {
			break
		}
	}
	if _, err := cfg.Pool.Exec(ctx, qAddHistory, pending.Load()%historyFlush); err != nil {
		return pending.Load(), db.Translate(err)
	}
	cfg.Logger.Info("history made", "commits", pending.Load(), "elapsed", time.Since(start).Round(time.Millisecond))
	return pending.Load(), nil
}

// historyCommit creates one record in a random account.
func historyCommit(ctx context.Context, cfg *Config, engine *repo.Engine, r *rand.Rand) error {
	i := r.IntN(min(cfg.Realistic, cfg.Accounts))
	var did string
	if err := cfg.Pool.QueryRow(ctx, qAccountOfIndex, cfg.Handle(i)).Scan(&did); err != nil {
		return fmt.Errorf("populate: account %d: %w", i, db.Translate(err))
	}
	collection := pickCollection(r)
	now := time.Now()
	rec, err := makeRecord(r, collection, syntax.NewTIDFromTime(now, uint(r.IntN(1024))).String(), now, nil)
	if err != nil {
		return err
	}
	data, err := atdata.UnmarshalCBOR(rec.block)
	if err != nil {
		return err
	}
	_, err = engine.Apply(ctx, syntax.DID(did), []repo.Write{{
		Action: repo.ActionCreate, Collection: syntax.NSID(collection), RKey: syntax.RecordKey(rec.rkey), Record: data,
	}}, nil)
	if err != nil {
		return fmt.Errorf("populate: history commit to %s: %w", did, err)
	}
	return nil
}
