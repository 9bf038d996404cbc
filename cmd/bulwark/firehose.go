package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/cluster"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
)

// newFirehose builds the event pipeline: the sequencer (writers wake it),
// the hub serving subscribeRepos, retention pruning and relay
// notification. The sequencer (with the relay notifier it feeds) and the
// pruner are singletons of the cluster, run under role's leases; the hub
// runs on every node and is returned as a service. onStuck hears of each
// consumer found stuck (the alert webhook).
func newFirehose(cfg *config.Config, pool *pgxpool.Pool, role *clusterRole, logger *slog.Logger, onStuck func(firehose.ConsumerReport)) (*eventlog.Sequencer, *firehose.Hub, []service) {
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: logger})
	log := eventlog.NewLog(pool)
	health := firehose.NewHealth(firehose.HealthConfig{
		Logger: logger,
		// The event a stuck consumer cannot get past, for the warning.
		Inspect: func(ctx context.Context, seq int64) (*eventlog.EventInfo, error) {
			evs, err := log.Inspect(ctx, eventlog.EventFilter{FromSeq: seq, Limit: 1})
			if err != nil || len(evs) == 0 {
				return nil, err
			}
			return &evs[0], nil
		},
		OnStuck: onStuck,
	})
	hub := firehose.NewHub(pool, firehose.Config{
		Retention: cfg.FirehoseRetention, Health: health, DisableOversizeSync: !cfg.FirehoseOversizeSync,
		Sessions: role.sessions, Logger: logger,
	})
	seq.OnSequenced(hub.Notify)
	pruner := eventlog.NewPruner(pool, eventlog.PrunerConfig{Retention: cfg.FirehoseRetention, Logger: logger})
	var crawl *firehose.CrawlNotifier
	if len(cfg.Crawlers) > 0 {
		// The relays are the operator's endpoints: called through the
		// guarded client, which reaches private addresses only where
		// --crawlers names them by address or --proxy-allow-private
		// allows them.
		crawl = firehose.NewCrawlNotifier(firehose.CrawlConfig{Hostname: cfg.Hostname, Crawlers: cfg.Crawlers, Client: operatorClient(cfg, logger, 30*time.Second), Logger: logger})
		seq.OnSequenced(crawl.Notify)
	}
	// The relays are told of new events by the node that numbers them.
	role.leases.Add(eventlog.SequencerLease, func(ctx context.Context, l cluster.Lease) error {
		if crawl == nil {
			return seq.Lead(ctx, l)
		}
		ctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { _ = crawl.Run(ctx) })
		defer wg.Wait()
		defer cancel()
		return seq.Lead(ctx, l)
	})
	role.singleton(leaseFirehosePruner, pruner.Run)
	return seq, hub, []service{{name: "firehose", run: hub.Run}}
}
