package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/bulwark-pds/bulwark/migrations"
)

// migrationLockID is the advisory lock that serialises migrations between
// processes (several nodes starting at once against one database).
const migrationLockID int64 = 0x62756c7761726b // "bulwark"

// newProvider builds a goose provider over pool. The returned close
// function releases the database/sql wrapper, not the pool.
func newProvider(pool *pgxpool.Pool) (*goose.Provider, func(), error) {
	// A waiting node polls the lock every second for up to ten minutes:
	// goose's default 5s period would add seconds to every contended start.
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(migrationLockID),
		lock.WithLockTimeout(1, 600),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("db: migration lock: %w", err)
	}
	opts := []goose.ProviderOption{
		goose.WithSessionLocker(locker),
		// Only the embedded files count: nothing registered globally by
		// another package may sneak into our schema history.
		goose.WithDisableGlobalRegistry(true),
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS, opts...)
	if err != nil {
		_ = sqlDB.Close()
		return nil, nil, fmt.Errorf("db: load migrations: %w", err)
	}
	return p, func() { _ = sqlDB.Close() }, nil
}

// Migrate applies every pending migration in migrations.FS. Concurrent
// callers, in this or other processes, queue on an advisory lock, so each
// migration runs once.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	p, closeDB, err := newProvider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	results, err := p.Up(ctx)
	if err != nil {
		var partial *goose.PartialError
		if errors.As(err, &partial) && partial.Failed != nil && partial.Failed.Source != nil {
			return fmt.Errorf("db: migration %s: %w", path.Base(partial.Failed.Source.Path), err)
		}
		return fmt.Errorf("db: migrate: %w", err)
	}
	for _, r := range results {
		logger.Info("applied migration", "migration", path.Base(r.Source.Path), "duration", r.Duration)
	}
	return nil
}

// MigrationStatus writes one line per known migration to w: version, file
// name, and when it was applied or "pending".
func MigrationStatus(ctx context.Context, pool *pgxpool.Pool, w io.Writer) error {
	p, closeDB, err := newProvider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	statuses, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("db: migration status: %w", err)
	}
	for _, s := range statuses {
		applied := "pending"
		if s.State == goose.StateApplied {
			applied = s.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
		}
		if _, err := fmt.Fprintf(w, "%05d  %-40s  %s\n", s.Source.Version, path.Base(s.Source.Path), applied); err != nil {
			return err
		}
	}
	return nil
}
