package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
)

// consoleDeps are the parts of the server the operator console shows.
type consoleDeps struct {
	pool     *pgxpool.Pool
	log      *eventlog.Log
	accounts *account.Service
	health   *firehose.Health
	watchers *watchers
	protect  *protection
	// clientIP is the public server's view of a client's address, set once
	// the pds server exists (the console is built before it).
	clientIP func(*http.Request) netip.Addr
}

// newConsole builds the operator console as --admin-console says: for the
// public listener (returned, for pds.Options.Console), on the private
// listener (mounted there; nil returned), or not at all. Its sampler runs
// as a service.
func newConsole(cfg *config.Config, d consoleDeps, logger *slog.Logger) (http.Handler, []service, error) {
	if cfg.AdminConsole == config.ConsoleOff {
		return nil, nil, nil
	}
	sampler := console.NewSampler(console.SamplerConfig{
		Head:     func(ctx context.Context) (int64, error) { return d.log.LastSeq(ctx) },
		Gatherer: metrics.Registry,
		Logger:   logger,
	})
	ccfg := console.Config{
		AdminPassword: cfg.AdminPassword, SessionSecret: []byte(cfg.JWTSecret),
		Log: d.log, Sync: repo.SyncEvent, DB: d.pool, Accounts: d.accounts,
		Watch: d.watchers.watch, Health: d.health, Samples: sampler, Budget: d.protect.budget,
		LoginLimiter: d.protect.limits.Get(ratelimit.PolicyConsoleLogin),
		Limiter:      d.protect.limits.Get(ratelimit.PolicyGlobal),
		Logger:       logger,
	}
	for _, f := range cfg.SecretFiles() {
		if f.Flag == "admin-password" {
			ccfg.AdminPasswordFile = f.Path
		}
	}
	private := cfg.AdminConsole == config.ConsolePrivate
	if private {
		// The private listener is plain http on an internal address:
		// a Secure cookie would never come back. Its clients are peers.
		ccfg.Secure = false
	} else {
		ccfg.Secure = !cfg.IsLocal()
		ccfg.ClientIP = func(r *http.Request) netip.Addr { return d.clientIP(r) }
	}
	c, err := console.New(ccfg)
	if err != nil {
		return nil, nil, err
	}
	services := []service{{name: "console sampler", run: sampler.Run}}
	if private {
		d.protect.private.Handle(console.Prefix, c)
		logger.Info("operator console on the private listener", "url", "http://"+cfg.MetricsListen+console.Prefix)
		return nil, services, nil
	}
	logger.Info("operator console", "url", cfg.PublicURL()+console.Prefix)
	return c, services, nil
}
