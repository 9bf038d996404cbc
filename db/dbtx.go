package db

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what storage code needs from Postgres: a *pgxpool.Pool, a pgx.Tx
// or a *pgx.Conn all satisfy it. Functions that take a DBTX run inside
// whatever transaction the caller holds, so one change can span packages
// (a commit and its event, a takedown and its audit entry).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
