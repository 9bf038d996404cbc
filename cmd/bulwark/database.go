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

// database is the Postgres a command uses: a pool, and the managed cluster
// behind it when there is no BULWARK_DATABASE_URL.
type database struct {
	Pool    *pgxpool.Pool
	managed *db.Managed // nil with an external database
	logger  *slog.Logger
}

// openDatabase connects to the configured database, starting the managed
// cluster under <data-dir>/postgres first when no URL is configured.
func openDatabase(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*database, error) {
	d := &database{logger: logger}
	url := cfg.DatabaseURL
	if url == "" {
		// 0711: under root, Postgres runs as an unprivileged user that
		// must be able to reach <data-dir>/postgres.
		if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
			return nil, fmt.Errorf("create data dir: %w", err)
		}
		m, err := db.StartManaged(ctx, db.ManagedConfig{
			Dir:    filepath.Join(cfg.DataDir, ManagedPostgresDir),
			Logger: logger,
		})
		if err != nil {
			return nil, fmt.Errorf("managed postgres: %w", err)
		}
		d.managed = m
		url = m.URL(db.ManagedDatabase)
	} else {
		logger.Info("using external postgres", "url", db.RedactURL(url))
	}
	pool, err := db.Open(ctx, url, logger)
	if err != nil {
		d.Close(context.Background())
		return nil, err
	}
	d.Pool = pool
	return d, nil
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
	if d.Pool != nil {
		d.Pool.Close()
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
		err = db.Migrate(ctx, d.Pool, logger)
	case "status":
		err = db.MigrationStatus(ctx, d.Pool, stdout)
	}
	if err != nil {
		logger.Error("migrate "+action, "error", err)
		return 1
	}
	return 0
}
