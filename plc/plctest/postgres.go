package plctest

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	didplc "github.com/did-method-plc/go-didplc"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed postgres.sql
var postgresSQL string

var (
	queries = db.MustParseQueries(postgresSQL)
	qLog    = queries.MustGet("Log")
	qAppend = queries.MustGet("Append")
	qCount  = queries.MustGet("Count")
)

// createdAtLayout is how the PLC directory writes a log entry's time.
const createdAtLayout = "2006-01-02T15:04:05.000Z"

// PostgresStore keeps the logs in the table dev_plc_operations (migration
// 00012), so a development server's DIDs live in its own database, next
// to its accounts, and survive restarts; several servers on one database
// share them.
type PostgresStore struct {
	db db.DBTX
}

// NewPostgresStore returns a store on conn (a pool, usually), whose
// database must be migrated.
func NewPostgresStore(conn db.DBTX) *PostgresStore {
	return &PostgresStore{db: conn}
}

// Log implements Store.
func (s *PostgresStore) Log(ctx context.Context, did string) ([]didplc.LogEntry, error) {
	rows, err := s.db.Query(ctx, qLog, did)
	if err != nil {
		return nil, fmt.Errorf("plctest: reading the log of %s: %w", did, db.Translate(err))
	}
	defer rows.Close()
	var out []didplc.LogEntry
	for rows.Next() {
		var (
			raw []byte
			e   = didplc.LogEntry{DID: did}
			at  time.Time
		)
		if err := rows.Scan(&raw, &e.CID, &at); err != nil {
			return nil, fmt.Errorf("plctest: reading the log of %s: %w", did, db.Translate(err))
		}
		if err := json.Unmarshal(raw, &e.Operation); err != nil {
			return nil, fmt.Errorf("plctest: stored operation of %s: %w", did, err)
		}
		e.CreatedAt = at.UTC().Format(createdAtLayout)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("plctest: reading the log of %s: %w", did, db.Translate(err))
	}
	return out, nil
}

// Append implements Store.
func (s *PostgresStore) Append(ctx context.Context, n int, entry didplc.LogEntry) error {
	op, err := json.Marshal(&entry.Operation)
	if err != nil {
		return err
	}
	at, err := time.Parse(createdAtLayout, entry.CreatedAt)
	if err != nil {
		return fmt.Errorf("plctest: entry time %q: %w", entry.CreatedAt, err)
	}
	tag, err := s.db.Exec(ctx, qAppend, entry.DID, n, entry.CID, string(op), at)
	if err = db.Translate(err); errors.Is(err, db.ErrConflict) || (err == nil && tag.RowsAffected() == 0) {
		return fmt.Errorf("%w: the log of %s moved on", ErrConflict, entry.DID)
	}
	if err != nil {
		return fmt.Errorf("plctest: storing an operation of %s: %w", entry.DID, err)
	}
	return nil
}

// Count implements Store.
func (s *PostgresStore) Count(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRow(ctx, qCount).Scan(&n); err != nil {
		return 0, fmt.Errorf("plctest: counting DIDs: %w", db.Translate(err))
	}
	return n, nil
}
