package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// protection is what keeps the server up under abuse: the in-flight byte
// budget, the rate limiters, and the metrics that show both at work.
type protection struct {
	budget *budget.Budget
	limits *ratelimit.Set
	// private is the --metrics-listen listener's routes (/metrics, pprof,
	// and the console when it is private); nil when that listener is off.
	private  *http.ServeMux
	services []service
}

// newProtection builds the budget and the rate limiters from cfg,
// registers them, the pool and the sequencer with the metrics, and returns
// the services that run beside the server: the limiters' pruning and, when
// --metrics-listen is set, the private metrics and pprof listener.
//
// metricsLn is the --metrics-listen listener when the caller bound it
// already; nil binds it here.
func newProtection(cfg *config.Config, pool *pgxpool.Pool, seq *eventlog.Sequencer, metricsLn net.Listener, logger *slog.Logger) (*protection, error) {
	queue := cfg.InflightQueue
	if queue == 0 {
		queue = -1 // budget.Config: negative is "no queue"
	}
	p := &protection{budget: budget.New(budget.Config{Capacity: cfg.InflightBudget, MaxQueue: queue})}
	policies, err := cfg.RateLimitPolicies()
	if err != nil {
		return nil, err
	}
	p.limits, err = ratelimit.NewSet(policies, cfg.RateLimitMaxKeys)
	if err != nil {
		return nil, fmt.Errorf("rate limits: %w", err)
	}
	metrics.RegisterPool(pool)
	metrics.RegisterBudget(func() metrics.BudgetStats { return metrics.BudgetStats(p.budget.Stats()) })
	metrics.RegisterLimiters(p.limits.All()...)
	if seq != nil {
		seq.OnSequenced(func(lastSeq int64) { metrics.EventLogLastSeq.Set(float64(lastSeq)) })
	}
	p.services = append(p.services, service{name: "rate limit pruning", run: func(ctx context.Context) error {
		p.limits.Run(ctx)
		return nil
	}})
	if cfg.MetricsListen != "" {
		p.private = metrics.PrivateMux()
		p.services = append(p.services, service{name: "metrics listener", run: func(ctx context.Context) error {
			if metricsLn != nil {
				return metrics.ServeListener(ctx, metricsLn, p.private, logger.With("component", "metrics"))
			}
			return metrics.ServeHandler(ctx, cfg.MetricsListen, p.private, logger.With("component", "metrics"))
		}})
	}
	logger.Info("protection", "inflight_budget", p.budget.Capacity(), "inflight_queue", cfg.InflightQueue,
		"rate_limiters", len(p.limits.All()), "metrics_listen", cfg.MetricsListen)
	return p, nil
}
