package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/outbound"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/serverid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stopTimeout bounds closing the pool and stopping the managed Postgres
// after the HTTP server has drained.
const stopTimeout = time.Minute

// runServe is `bulwark serve`: configure, open (and migrate) the database,
// serve until SIGINT/SIGTERM, then shut down in order: stop accepting, drain
// requests in flight (up to --shutdown-timeout), close the pool, stop the
// managed Postgres last.
func runServe(ctx context.Context, args []string, stderr io.Writer) int {
	fs, cfg := settingsFlags("serve", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: bulwark serve [flags]\n\nEvery flag can also be set by the environment variable shown in brackets;\na flag wins over the environment.\n\nFlags:")
		fs.PrintDefaults()
	}
	if code, ok := parseSettings(fs, cfg, args); !ok {
		return code
	}
	logger := cfg.NewLogger(stderr)
	slog.SetDefault(logger)

	if err := serve(ctx, cfg, logger, stderr); err != nil {
		logger.Error("bulwark stopped on an error", "error", err)
		return 1
	}
	return 0
}

// serve runs the server configured by cfg until a signal, or until the
// HTTP server, the managed Postgres or a background service fails. The
// start banner goes to banner (stderr), unless the log is JSON.
//
// The order matters for a failed start: the listeners are bound first and
// the data directory's lock taken before anything is created, so a second
// server on a busy port or a data dir in use fails at once and leaves
// nothing behind.
func serve(ctx context.Context, cfg *config.Config, logger *slog.Logger, banner io.Writer) error {
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	st, err := startListening(cfg)
	if err != nil {
		return err
	}
	defer st.close()
	generated, err := cfg.EnsureSecrets()
	if err != nil {
		return err
	}
	for _, name := range generated {
		logger.Warn("generated a secret into the data dir; production should set it explicitly",
			"setting", name, "dir", filepath.Join(cfg.DataDir, config.SecretsDir))
	}
	logger.Info("starting bulwark", "version", Version(), "listen", cfg.Listen, "data_dir", cfg.DataDir)
	// The whole configuration is long; `bulwark config` prints it too.
	logger.Debug("configuration", "config", cfg)
	gcPercent, memLimit := config.ApplyGC(cfg.GCPercent)
	logger.Debug("garbage collector", "gc_percent", gcPercent, "memory_limit", memLimit)

	d, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		d.Close(ctx)
	}()
	if err := db.Migrate(ctx, d.Sessions, logger); err != nil {
		return err
	}
	role, err := joinCluster(ctx, cfg, d, logger)
	if err != nil {
		return err
	}
	// Until its services run (and leave the cluster when they stop), a
	// start that fails leaves the cluster here, so the other nodes do not
	// count it as running.
	servicesStarted := false
	defer func() {
		if !servicesStarted {
			role.abandon()
		}
	}()

	devPLC := newDevPLC(cfg, d.Pool, logger)
	if err := checkHost(ctx, cfg, d.Pool, devPLC, logger); err != nil {
		return err
	}
	rt := serverid.NewRuntime(adminURL(cfg.Listen), cfg.PublicURL(), cfg.ServiceDID())
	b, err := buildServer(ctx, cfg, d.Pool, role, devPLC, st.metricsLn, logger, publicRoutes(cfg, d.Pool, &rt, devPLC))
	if err != nil {
		return err
	}
	svcs := startServices(b.services)
	servicesStarted = true
	defer svcs.cancel()
	hs := b.srv.HTTPServer()
	info, err := newStartInfo(ctx, cfg, d.Pool)
	if err != nil {
		return err
	}
	removeRuntime, err := writeRuntime(cfg, &rt, logger)
	if err != nil {
		return err
	}
	defer removeRuntime()
	if cfg.LogFormat != "json" {
		// Plain lines would break a JSON log collector's parsing; the
		// log entry below carries the same facts.
		fmt.Fprint(banner, bannerText(info))
	}
	logger.Info("bulwark is ready", info.logAttrs()...)
	runErr := serveUntilStopped(ctx, stopSignals, cfg, hs, st.ln, d.Done(), svcs.errs, logger)
	svcs.stop()
	return runErr
}

// listen binds the public listener, before anything else is set up, so
// that a port in use is reported at once and costs nothing.
func listen(cfg *config.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (--listen, BULWARK_LISTEN): %w%s", cfg.Listen, err, portHint(err))
	}
	return ln, nil
}

// newServer builds the PDS on the migrated database, and the background
// services that run beside its HTTP server: started once the database is
// migrated, stopped after the HTTP server has drained and before the pool
// closes. Add one as a line here (sequencer, firehose hub, crawl
// notifier, ...).
//
// role is how the server takes part in the cluster on its database: the
// singleton jobs (sequencer, pruning, blob collection, ...) run under its
// leases. nil: a role of its own (a server built by a test, never joined).
//
// devPLC, when not nil, is the development PLC directory this server runs:
// the PLC client then submits to it in process.
func newServer(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, role *clusterRole, devPLC *plctest.Directory, logger *slog.Logger) (*pds.Server, []service, error) {
	b, err := buildServer(ctx, cfg, pool, role, devPLC, nil, logger, publicRoutes(cfg, pool, nil, devPLC))
	if err != nil {
		return nil, nil, err
	}
	return b.srv, b.services, nil
}

// builtServer is the PDS, the services beside it and its rate limiters.
type builtServer struct {
	srv      *pds.Server
	services []service
	limits   *ratelimit.Set
}

// buildServer is newServer with the --metrics-listen listener bound by the
// caller (nil: bound when its service starts) and the paths to serve
// beside the PDS's own (publicRoutes), returning the rate limiters too.
func buildServer(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, role *clusterRole, devPLC *plctest.Directory, metricsLn net.Listener, logger *slog.Logger, routes []pds.Route) (*builtServer, error) {
	srv, services, limits, err := assembleServer(ctx, cfg, pool, role, devPLC, metricsLn, logger, routes)
	if err != nil {
		return nil, err
	}
	return &builtServer{srv: srv, services: services, limits: limits}, nil
}

func assembleServer(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, role *clusterRole, devPLC *plctest.Directory, metricsLn net.Listener, logger *slog.Logger, routes []pds.Route) (*pds.Server, []service, *ratelimit.Set, error) {
	if role == nil {
		role = standaloneRole(pool)
	}
	alerts, services, err := newAlerts(cfg, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	sequencer, hub, firehoseServices := newFirehose(cfg, pool, role, logger, consumerStuckAlert(alerts))
	services = append(services, firehoseServices...)
	watch, err := newWatchers(cfg, eventlog.NewLog(pool), alerts, func() bool { return role.holds(leaseRelayAlerts) }, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	services = append(services, watch.services...)
	if watch.watch != nil {
		role.singleton(leaseRelayAlerts, func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		})
	}
	protect, err := newProtection(cfg, pool, sequencer, metricsLn, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	services = append(services, protect.services...)
	hub.UseBudget(protect.budget)

	blobs, err := newBlobService(ctx, cfg, pool, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	role.singleton(leaseBlobCollector, blobs.Run)
	var plcHTTP *http.Client
	if devPLC != nil {
		plcHTTP = devPLC.Client()
	}
	accounts, engine, keys, err := newAccountStack(cfg, pool, sequencer, repo.Config{Blobs: blobs, Sessions: role.sessions}, plcHTTP, protect.limits, logger, blobs)
	if err != nil {
		return nil, nil, nil, err
	}
	role.useClock(engine.SetClockID)
	hintServices, err := role.hints(ctx, cfg, engine, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	services = append(services, hintServices...)
	services = append(services, service{name: "mailer", run: accounts.Mail().Run})
	opts := pds.Options{Config: cfg, DB: pool, Logger: logger, Version: Version(), Accounts: accounts, Repo: engine, Blobs: blobs, Firehose: hub, Budget: protect.budget, Limits: protect.limits}
	// One client for every URL a user influences, so one guard and one
	// allow list (--proxy-allow-private) cover them all. Its timeout also
	// bounds the wait for response headers in its transport, which the
	// proxy shares: at least --proxy-header-timeout.
	opts.Outbound = outbound.New(outbound.Config{
		AllowCIDRs: cfg.ProxyAllowPrivate,
		Timeout:    max(outbound.DefaultTimeout, cfg.ProxyHeaderTimeout),
		Resolver:   dnsResolver(cfg),
		Logger:     logger,
	})
	opts.Keys = keys
	opts.OAuth = newOAuthConfig(cfg, opts.Outbound, logger)
	if cfg.CARCache > 0 {
		opts.CARCacheDir = filepath.Join(cfg.DataDir, "car-cache")
	}
	opts.OnOverload = func() { watch.storm.Record() }
	var srv *pds.Server
	consoleHandler, consoleServices, err := newConsole(cfg, consoleDeps{
		pool: pool, log: eventlog.NewLog(pool), accounts: accounts, health: hub.Health(), watchers: watch, protect: protect,
		clientIP: func(r *http.Request) netip.Addr { return srv.ClientIP(r) },
	}, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	services = append(services, consoleServices...)
	opts.Console = consoleHandler
	opts.Routes = routes
	srv, err = pds.New(opts)
	if err != nil {
		return nil, nil, nil, err
	}
	role.singleton(leaseOAuthCleanup, func(ctx context.Context) error {
		srv.OAuth().Run(ctx, 0)
		return nil
	})
	services = append(services, role.services()...)
	slots := srv.ExportSlots()
	metrics.RegisterExportSlots(func() metrics.BudgetStats { return metrics.BudgetStats(slots.Stats()) })
	hub.UsePriority(srv.Priority())
	return srv, services, protect.limits, nil
}

// serveUntilStopped serves hs on ln until ctx ends (a signal), the HTTP
// server fails, the managed Postgres exits (dbDone) or a service fails
// (svcErr), then stops accepting and drains the requests in flight for up
// to cfg.ShutdownTimeout. It returns what stopped the server, nil for a
// signal.
func serveUntilStopped(ctx context.Context, stopSignals context.CancelFunc, cfg *config.Config, hs *http.Server, ln net.Listener, dbDone <-chan struct{}, svcErr <-chan error, logger *slog.Logger) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	logger.Info("serving", "addr", ln.Addr().String(), "public_url", cfg.PublicURL(), "did", cfg.ServiceDID())

	var runErr error
	served := false
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "reason", context.Cause(ctx))
	case err := <-serveErr:
		served = true
		runErr = fmt.Errorf("http server: %w", err)
	case <-dbDone:
		runErr = errors.New("managed postgres exited unexpectedly; see <data-dir>/postgres/postgres.log")
	case err := <-svcErr:
		runErr = err
	}
	// A second signal now kills the process at once, for an operator who
	// does not want to wait for the drain.
	stopSignals()

	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		logger.Warn("requests still running at the shutdown timeout; closing them", "error", err)
		_ = hs.Close()
	}
	if !served {
		if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) && runErr == nil {
			runErr = fmt.Errorf("http server: %w", err)
		}
	}
	logger.Info("http server stopped")
	return runErr
}

// runningServices are the background services startServices started.
type runningServices struct {
	cancel context.CancelFunc // ends every service's context
	wg     sync.WaitGroup
	errs   chan error // a service that failed before cancel
}

// startServices runs each service in its own goroutine until cancel or
// stop. An error a service returns before then is sent on errs.
func startServices(services []service) *runningServices {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningServices{cancel: cancel, errs: make(chan error, len(services))}
	for _, svc := range services {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := svc.run(ctx); err != nil && ctx.Err() == nil {
				r.errs <- fmt.Errorf("%s: %w", svc.name, err)
			}
		}()
	}
	return r
}

// stop ends the services and waits for them to return.
func (r *runningServices) stop() {
	r.cancel()
	r.wg.Wait()
}

// service is a long-running part of the server beside the HTTP listener.
// run works until ctx ends and then returns; an error before that stops
// the whole server.
type service struct {
	name string
	run  func(ctx context.Context) error
}
