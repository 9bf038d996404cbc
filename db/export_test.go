package db

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrateDownTo rolls the schema back to version (0: nothing), for the
// test that every migration's Down section works.
func MigrateDownTo(ctx context.Context, pool *pgxpool.Pool, version int64) error {
	p, closeDB, err := newProvider(pool)
	if err != nil {
		return err
	}
	defer closeDB()
	_, err = p.DownTo(ctx, version)
	return err
}
