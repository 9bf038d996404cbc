package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
)

// ManagedPostgresDir is where the managed cluster lives under the data dir.
const ManagedPostgresDir = "postgres"

// database is the Postgres a command uses: a pool, the pool of direct
// sessions beside it (the same one unless --database-url goes through a
// transaction-mode pooler), and the managed cluster behind them when there
// is no BULWARK_DATABASE_URL.
type database struct {
	Pool *pgxpool.Pool
	// Sessions reaches Postgres without a pooler: LISTEN, the migration
	// lock, imports.
	Sessions *pgxpool.Pool
	pools    *db.Pools
	managed  *db.Managed // nil with an external database
	logger   *slog.Logger
}

// openDatabase connects to the configured database, starting the managed
// cluster under <data-dir>/postgres first when no URL is configured.
func openDatabase(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*database, error) {
	d := &database{logger: logger}
	if cfg.DatabaseURL == "" {
		// 0711: under root, Postgres runs as an unprivileged user that
		// must be able to reach <data-dir>/postgres.
		if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
		m, err := db.StartManaged(ctx, db.ManagedConfig{
			Dir:      filepath.Join(cfg.DataDir, ManagedPostgresDir),
			Logger:   logger,
			Settings: cfg.PostgresSettings,
		})
		if err != nil {
			return nil, fmt.Errorf("managed postgres: %w", err)
		}
		d.managed = m
		pool, err := db.Open(ctx, m.URL(db.ManagedDatabase), logger)
		if err != nil {
			d.Close(context.Background())
			return nil, err
		}
		d.pools = &db.Pools{Main: pool, Sessions: pool}
	} else {
		logger.Info("using external postgres", "url", db.RedactURL(cfg.DatabaseURL))
		pools, err := db.OpenPools(ctx, cfg.DatabaseURL, cfg.DatabaseDirectURL, logger)
		var pe *db.PoolerError
		if errors.As(err, &pe) {
			return nil, poolerRefusal(pe)
		}
		if err != nil {
			return nil, err
		}
		d.pools = pools
		if pools.Pooled {
			warnPooledSettings(ctx, pools.Main, logger)
		}
	}
	d.Pool, d.Sessions = d.pools.Main, d.pools.Sessions
	return d, nil
}

// poolerRefusal explains why a transaction-mode pooler needs a direct
// connection beside it, and what to set.
func poolerRefusal(pe *db.PoolerError) error {
	if pe.Direct {
		return errors.New("--database-direct-url (BULWARK_DATABASE_DIRECT_URL) goes through a connection pooler in transaction mode too: " +
			"it must reach Postgres itself (or the pooler in session mode), since LISTEN and the migration lock live on one session")
	}
	return errors.New("--database-url (BULWARK_DATABASE_URL) goes through a connection pooler in transaction mode (PgBouncer, or a managed " +
		"database's pooler), which hands each transaction to any server connection. Bulwark keeps some work on one session: LISTEN " +
		"(firehose wake-ups across nodes, mail), the migration lock and an import's staging tables; through such a pooler they would " +
		"silently stop working. Set --database-direct-url (BULWARK_DATABASE_DIRECT_URL) to a URL that reaches the same database " +
		"without the pooler (Postgres itself, or the pooler in session mode), or point --database-url at Postgres directly")
}

// warnPooledSettings warns when sessions through a pooler lack the
// timeouts Bulwark sets itself on direct connections (a pooler refuses
// them at connect): they belong on the database role there.
func warnPooledSettings(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) {
	v, err := db.ServerSetting(ctx, pool, "idle_in_transaction_session_timeout")
	if err == nil && v == "0" {
		logger.Warn("the database role has no idle_in_transaction_session_timeout: a node that freezes mid-transaction holds its locks " +
			"until it wakes; set it on the role, e.g. ALTER ROLE bulwark SET idle_in_transaction_session_timeout = '60s' (see docs/SCALING.md)")
	}
	logger.Info("the database URL goes through a transaction-mode pooler; sessions use --database-direct-url")
}

// Done is closed if the managed Postgres exits on its own; nil (never
// ready) with an external database.
func (d *database) Done() <-chan struct{} {
	if d.managed == nil {
		return nil
	}
	return d.managed.Done()
}

// Close closes the pool, then stops the managed cluster: last, so that
// nothing still running loses its database.
func (d *database) Close(ctx context.Context) {
	if d.pools != nil {
		d.pools.Close()
	}
	if d.managed != nil {
		if err := d.managed.Stop(ctx); err != nil {
			d.logger.Error("stopping managed postgres", "error", err)
		}
	}
}

// runMigrate is `bulwark migrate [flags] up|status`. The action may come
// before or after the flags.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var action string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	fs, cfg := settingsFlags("migrate", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: bulwark migrate [flags] up|status\n\nThe database is chosen as for serve: --database-url, else the managed cluster in --data-dir.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if action == "" {
		action = fs.Arg(0)
	} else if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bulwark migrate: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if action != "up" && action != "status" {
		fs.Usage()
		return 2
	}
	if err := cfg.Finalize(); err != nil {
		fmt.Fprintln(stderr, "bulwark:", err)
		return 2
	}
	logger := cfg.NewLogger(stderr)

	d, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		logger.Error("open database", "error", err)
		return 1
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.Close(ctx)
	}()
	switch action {
	case "up":
		err = db.Migrate(ctx, d.Sessions, logger)
	case "status":
		err = db.MigrationStatus(ctx, d.Sessions, stdout)
	}
	if err != nil {
		logger.Error("migrate "+action, "error", err)
		return 1
	}
	return 0
}
