package eventlog

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qInsertEvent        = queries.MustGet("InsertEvent")
	qLockSequencer      = queries.MustGet("LockSequencer")
	qSequenceBatch      = queries.MustGet("SequenceBatch")
	qRaiseLastSeq       = queries.MustGet("RaiseLastSeq")
	qLastSeq            = queries.MustGet("LastSeq")
	qEventsAfter        = queries.MustGet("EventsAfter")
	qEventsAfterBounded = queries.MustGet("EventsAfterBounded")
	qCursorPoint        = queries.MustGet("CursorPoint")
	qFirstSeqSince      = queries.MustGet("FirstSeqSince")
	qOldestSeq          = queries.MustGet("OldestSeq")
	qPruneEvents        = queries.MustGet("PruneEvents")
	qListenSequenced    = queries.MustGet("ListenSequenced")
	qCountUnsequenced   = queries.MustGet("CountUnsequenced")
)

// ErrNoEvent means no sequenced event matches.
var ErrNoEvent = errors.New("no such event")

// Append stores an encoded event, unsequenced, through q (normally the
// writer's transaction). The Sequencer gives it a seq once it commits.
func Append(ctx context.Context, q db.DBTX, ev *Encoded) error {
	_, err := q.Exec(ctx, qInsertEvent, ev.DID, string(ev.Kind), ev.RevArg(), ev.Body, ev.SeqOffset, ev.BlocksLen, ev.OpsCount)
	if err != nil {
		return fmt.Errorf("appending #%s event: %w", ev.Kind, db.Translate(err))
	}
	return nil
}

// Log reads the event log.
type Log struct {
	pool *pgxpool.Pool
	// sessions holds WatchSequenced's LISTEN session (pool unless
	// UseSessions says otherwise).
	sessions *pgxpool.Pool
}

// NewLog returns a reader of the event log in pool's database.
func NewLog(pool *pgxpool.Pool) *Log {
	return &Log{pool: pool, sessions: pool}
}

// UseSessions makes WatchSequenced listen on a connection of sessions, a
// pool that reaches Postgres directly, for a log whose pool goes through
// a transaction-mode pooler (a LISTEN there would be lost with the
// transaction's server connection).
func (l *Log) UseSessions(sessions *pgxpool.Pool) {
	if sessions != nil {
		l.sessions = sessions
	}
}

// After returns up to limit sequenced, valid events with seq > after, in seq
// order.
func (l *Log) After(ctx context.Context, after int64, limit int) ([]Event, error) {
	return readEvents(ctx, l.pool, after, qEventsAfter, after, limit)
}

// Page returns the sequenced, valid events with seq > after, in seq order:
// at most limit of them, and none past the one that brings their bodies to
// maxBytes (always at least one). The bodies left out are never read.
func (l *Log) Page(ctx context.Context, after int64, limit, maxBytes int) ([]Event, error) {
	return readEvents(ctx, l.pool, after, qEventsAfterBounded, after, limit, maxBytes)
}

// readEvents runs a query whose rows are whole events (seq, did, kind, rev,
// created_at, body, seq_offset, blocks_len, ops_count).
func readEvents(ctx context.Context, q db.DBTX, after int64, query string, args ...any) ([]Event, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("reading events after %d: %w", after, db.Translate(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var ev Event
		var kind string
		err := row.Scan(&ev.Seq, &ev.DID, &kind, &ev.Rev, &ev.CreatedAt, &ev.Body, &ev.SeqOffset, &ev.BlocksLen, &ev.OpsCount)
		ev.Kind = Kind(kind)
		return ev, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading events after %d: %w", after, db.Translate(err))
	}
	return out, nil
}

// CursorPoint returns the seq and creation time of the first sequenced event
// at or after seq, reading nothing else (an index-only scan): resolving a
// cursor costs the same whatever the size of the event there.
func (l *Log) CursorPoint(ctx context.Context, seq int64) (int64, time.Time, error) {
	var got int64
	var at time.Time
	err := db.Translate(l.pool.QueryRow(ctx, qCursorPoint, seq).Scan(&got, &at))
	if errors.Is(err, db.ErrNotFound) {
		return 0, time.Time{}, ErrNoEvent
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("resolving cursor %d: %w", seq, err)
	}
	return got, at, nil
}

// FirstSeqSince returns the first sequenced event created at or after t.
func (l *Log) FirstSeqSince(ctx context.Context, t time.Time) (int64, error) {
	var seq int64
	err := db.Translate(l.pool.QueryRow(ctx, qFirstSeqSince, t).Scan(&seq))
	if errors.Is(err, db.ErrNotFound) {
		return 0, ErrNoEvent
	}
	if err != nil {
		return 0, fmt.Errorf("finding first event since %s: %w", t, err)
	}
	return seq, nil
}

// LastSeq returns the highest seq assigned so far (0 when none).
func (l *Log) LastSeq(ctx context.Context) (int64, error) {
	var seq int64
	if err := l.pool.QueryRow(ctx, qLastSeq).Scan(&seq); err != nil {
		return 0, fmt.Errorf("reading last seq: %w", db.Translate(err))
	}
	return seq, nil
}

// OldestSeq returns the lowest seq still in the log (an index-only read).
func (l *Log) OldestSeq(ctx context.Context) (int64, error) {
	var seq int64
	if err := l.pool.QueryRow(ctx, qOldestSeq).Scan(&seq); err != nil {
		return 0, fmt.Errorf("reading oldest seq: %w", db.Translate(err))
	}
	return seq, nil
}

// WatchSequenced calls notify whenever a sequencer in any process has
// numbered a batch (the NotifyChannel), and once as soon as it listens, so
// that anything sequenced before the LISTEN took effect is not missed. It
// holds a connection of its own (a LISTEN needs one session for good) until
// ctx ends or the connection fails, and returns why.
func (l *Log) WatchSequenced(ctx context.Context, notify func()) error {
	conn, err := l.sessions.Acquire(ctx)
	if err != nil {
		return err
	}
	// Hijack so the LISTEN session never returns to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, qListenSequenced); err != nil {
		return err
	}
	notify()
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return err
		}
		notify()
	}
}
