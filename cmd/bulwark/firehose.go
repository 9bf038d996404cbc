package main

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
)

// newFirehose builds the event pipeline: the sequencer (writers wake it),
// the hub serving subscribeRepos, retention pruning and relay
// notification, and returns the background services that run them.
// onStuck hears of each consumer found stuck (the alert webhook).
func newFirehose(cfg *config.Config, pool *pgxpool.Pool, logger *slog.Logger, onStuck func(firehose.ConsumerReport)) (*eventlog.Sequencer, *firehose.Hub, []service) {
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
	hub := firehose.NewHub(pool, firehose.Config{Retention: cfg.FirehoseRetention, Health: health, DisableOversizeSync: !cfg.FirehoseOversizeSync, Logger: logger})
	seq.OnSequenced(hub.Notify)
	pruner := eventlog.NewPruner(pool, eventlog.PrunerConfig{Retention: cfg.FirehoseRetention, Logger: logger})
	services := []service{
		{name: "sequencer", run: seq.Run},
		{name: "firehose", run: hub.Run},
		{name: "firehose pruner", run: pruner.Run},
	}
	if len(cfg.Crawlers) > 0 {
		crawl := firehose.NewCrawlNotifier(firehose.CrawlConfig{Hostname: cfg.Hostname, Crawlers: cfg.Crawlers, Logger: logger})
		seq.OnSequenced(crawl.Notify)
		services = append(services, service{name: "crawl notifier", run: crawl.Run})
	}
	return seq, hub, services
}
