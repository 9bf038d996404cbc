// Package audit records admin writes and firehose repairs: who, when, what,
// and the state before and after, in the audit_log table. Entries are
// written in the same transaction as the change they describe, so the log
// never claims a change that did not happen.
package audit

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed audit.sql
var queriesSQL string

var (
	queries = db.MustParseQueries(queriesSQL)
	qInsert = queries.MustGet("Insert")
	qList   = queries.MustGet("List")
)

// Entry is one audited change.
type Entry struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Actor   string    `json:"actor"`
	Action  string    `json:"action"`
	Subject string    `json:"subject"`
	Before  any       `json:"before,omitempty"`
	After   any       `json:"after,omitempty"`
	Reason  string    `json:"reason,omitempty"`
}

// Record writes e through q (the transaction making the change) and fills in
// its ID and time.
func Record(ctx context.Context, q db.DBTX, e *Entry) error {
	before, err := marshal(e.Before)
	if err != nil {
		return err
	}
	after, err := marshal(e.After)
	if err != nil {
		return err
	}
	if err := q.QueryRow(ctx, qInsert, e.Actor, e.Action, e.Subject, before, after, e.Reason).Scan(&e.ID, &e.At); err != nil {
		return fmt.Errorf("recording audit entry: %w", db.Translate(err))
	}
	return nil
}

func marshal(v any) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding audit state: %w", err)
	}
	return b, nil
}

// List returns up to limit entries, newest first, optionally for one
// subject, before the entry with ID before (0 = from the newest).
func List(ctx context.Context, q db.DBTX, subject string, before int64, limit int) ([]Entry, error) {
	rows, err := q.Query(ctx, qList, subject, before, limit)
	if err != nil {
		return nil, fmt.Errorf("listing audit entries: %w", db.Translate(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Entry, error) {
		var e Entry
		var beforeJSON, afterJSON []byte
		if err := row.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Subject, &beforeJSON, &afterJSON, &e.Reason); err != nil {
			return e, err
		}
		if beforeJSON != nil {
			e.Before = json.RawMessage(beforeJSON)
		}
		if afterJSON != nil {
			e.After = json.RawMessage(afterJSON)
		}
		return e, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing audit entries: %w", db.Translate(err))
	}
	return out, nil
}
