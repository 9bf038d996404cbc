package firehose

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	cbg "github.com/whyrusleeping/cbor-gen"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qInsertEvent   = queries.MustGet("InsertEvent")
	qLockSequencer = queries.MustGet("LockSequencer")
	qSequenceBatch = queries.MustGet("SequenceBatch")
	qRaiseLastSeq  = queries.MustGet("RaiseLastSeq")
	qLastSeq       = queries.MustGet("LastSeq")
	qEventsAfter   = queries.MustGet("EventsAfter")
	qCursorPoint   = queries.MustGet("CursorPoint")
	qFirstSeqSince = queries.MustGet("FirstSeqSince")
)

// Kind is the type of a stored event, without the leading '#'.
type Kind string

// The event kinds Bulwark stores. #info and error frames are never stored.
const (
	KindCommit   Kind = "commit"
	KindSync     Kind = "sync"
	KindIdentity Kind = "identity"
	KindAccount  Kind = "account"
)

// seqPlaceholder is stored in place of an event's seq: the largest int64,
// which CBOR encodes in the full 9 bytes, so the real seq always fits.
const seqPlaceholder = math.MaxInt64

// seqPlaceholderLen is the encoded size of seqPlaceholder.
const seqPlaceholderLen = 9

// seqKeyPattern is the "seq" map key followed by the placeholder value.
var seqKeyPattern = []byte{0x63, 's', 'e', 'q', 0x1b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Execer is what appending needs from a pgx.Tx (or a pool, outside a
// transaction).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Encoded is an event body ready to store: DAG-CBOR with the seq placeholder
// at SeqOffset.
type Encoded struct {
	Kind      Kind
	DID       string
	Rev       string
	Body      []byte
	SeqOffset int
	BlocksLen int
	OpsCount  int
}

// FrameSize is the size of the frame this event becomes on the wire, at most.
func (e *Encoded) FrameSize() int {
	return len(headerBytes[e.Kind]) + len(e.Body)
}

// EncodeCommit encodes a #commit body. Seq is ignored.
func EncodeCommit(ev *comatproto.SyncSubscribeRepos_Commit) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindCommit, ev.Repo, ev.Rev, len(ev.Blocks), len(ev.Ops), c.MarshalCBOR)
}

// EncodeSync encodes a #sync body. Seq is ignored.
func EncodeSync(ev *comatproto.SyncSubscribeRepos_Sync) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindSync, ev.Did, ev.Rev, len(ev.Blocks), 0, c.MarshalCBOR)
}

// EncodeIdentity encodes an #identity body. Seq is ignored.
func EncodeIdentity(ev *comatproto.SyncSubscribeRepos_Identity) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindIdentity, ev.Did, "", 0, 0, c.MarshalCBOR)
}

// EncodeAccount encodes an #account body. Seq is ignored.
func EncodeAccount(ev *comatproto.SyncSubscribeRepos_Account) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindAccount, ev.Did, "", 0, 0, c.MarshalCBOR)
}

func encode(kind Kind, did, rev string, blocksLen, opsCount int, marshal func(w io.Writer) error) (*Encoded, error) {
	var buf bytes.Buffer
	if err := marshal(&buf); err != nil {
		return nil, fmt.Errorf("encoding #%s event: %w", kind, err)
	}
	body := buf.Bytes()
	// "seq" sorts before every longer key and after only "ops" and "rev",
	// whose values cannot contain the placeholder bytes (0xff is never
	// valid UTF-8), so the first match is the field itself.
	i := bytes.Index(body, seqKeyPattern)
	if i < 0 {
		return nil, fmt.Errorf("encoding #%s event: seq field not found", kind)
	}
	return &Encoded{
		Kind:      kind,
		DID:       did,
		Rev:       rev,
		Body:      body,
		SeqOffset: i + 4,
		BlocksLen: blocksLen,
		OpsCount:  opsCount,
	}, nil
}

// Append stores an encoded event, unsequenced, through q (normally the
// writer's transaction). The Sequencer gives it a seq once it commits.
func Append(ctx context.Context, q Execer, ev *Encoded) error {
	_, err := q.Exec(ctx, qInsertEvent, ev.DID, string(ev.Kind), ev.RevArg(), ev.Body, ev.SeqOffset, ev.BlocksLen, ev.OpsCount)
	if err != nil {
		return fmt.Errorf("appending #%s event: %w", ev.Kind, db.Translate(err))
	}
	return nil
}

// Event is a sequenced event read back from the log.
type Event struct {
	Seq       int64
	DID       string
	Kind      Kind
	Rev       string
	CreatedAt time.Time
	Body      []byte
	SeqOffset int
	BlocksLen int
	OpsCount  int
}

// FrameSize is the size of the frame this event becomes on the wire, at most.
func (e *Event) FrameSize() int {
	return len(headerBytes[e.Kind]) + len(e.Body)
}

// Log reads the event log.
type Log struct {
	pool *pgxpool.Pool
}

// NewLog returns a reader of the event log in pool's database.
func NewLog(pool *pgxpool.Pool) *Log {
	return &Log{pool: pool}
}

// After returns up to limit sequenced, valid events with seq > after, in seq
// order.
func (l *Log) After(ctx context.Context, after int64, limit int) ([]Event, error) {
	return readEvents(ctx, l.pool, after, qEventsAfter, after, limit)
}

// readEvents runs a query whose rows are whole events (seq, did, kind, rev,
// created_at, body, seq_offset, blocks_len, ops_count).
func readEvents(ctx context.Context, pool *pgxpool.Pool, after int64, query string, args ...any) ([]Event, error) {
	rows, err := pool.Query(ctx, query, args...)
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

// ErrNoEvent means no sequenced event matches.
var ErrNoEvent = errors.New("no such event")

// CursorPoint returns the seq and creation time of the first sequenced event
// at or after seq, reading nothing else (an index-only scan): resolving a
// cursor costs the same whatever the size of the event there.
func (l *Log) CursorPoint(ctx context.Context, seq int64) (int64, time.Time, error) {
	var got int64
	var at time.Time
	err := l.pool.QueryRow(ctx, qCursorPoint, seq).Scan(&got, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, ErrNoEvent
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("resolving cursor %d: %w", seq, db.Translate(err))
	}
	return got, at, nil
}

// FirstSeqSince returns the first sequenced event created at or after t.
func (l *Log) FirstSeqSince(ctx context.Context, t time.Time) (int64, error) {
	var seq int64
	err := l.pool.QueryRow(ctx, qFirstSeqSince, t).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrNoEvent
	}
	if err != nil {
		return 0, fmt.Errorf("finding first event since %s: %w", t, db.Translate(err))
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

// headerBytes holds the encoded frame header {op: 1, t: "#kind"} per kind.
var headerBytes = map[Kind][]byte{}

func init() {
	for _, k := range []Kind{KindCommit, KindSync, KindIdentity, KindAccount, "info"} {
		headerBytes[k] = encodeHeader(1, "#"+string(k))
	}
}

// encodeHeader writes an event-stream header: a DAG-CBOR map with keys in
// canonical order ("t" before "op"); t is omitted for error frames.
func encodeHeader(op int64, t string) []byte {
	var buf bytes.Buffer
	cw := cbg.NewCborWriter(&buf)
	n := uint64(2)
	if t == "" {
		n = 1
	}
	_ = cw.WriteMajorTypeHeader(cbg.MajMap, n)
	if t != "" {
		_ = cw.WriteMajorTypeHeader(cbg.MajTextString, 1)
		_, _ = cw.WriteString("t")
		_ = cw.WriteMajorTypeHeader(cbg.MajTextString, uint64(len(t)))
		_, _ = cw.WriteString(t)
	}
	_ = cw.WriteMajorTypeHeader(cbg.MajTextString, 2)
	_, _ = cw.WriteString("op")
	if op < 0 {
		_ = cw.WriteMajorTypeHeader(cbg.MajNegativeInt, uint64(-op-1))
	} else {
		_ = cw.WriteMajorTypeHeader(cbg.MajUnsignedInt, uint64(op))
	}
	return buf.Bytes()
}

// AppendFrame appends the wire frame of a stored event with its seq to dst
// and returns the extended slice. No decoding: the seq placeholder is
// replaced in place.
func AppendFrame(dst []byte, kind Kind, body []byte, seqOffset int, seq int64) []byte {
	dst = append(dst, headerBytes[kind]...)
	dst = append(dst, body[:seqOffset]...)
	dst = appendCBORUint(dst, uint64(seq))
	return append(dst, body[seqOffset+seqPlaceholderLen:]...)
}

func appendCBORUint(dst []byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0x18, byte(v))
	case v <= math.MaxUint16:
		return append(dst, 0x19, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return append(dst, 0x1a, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		return append(dst, 0x1b, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
}

// QueueAppend queues the insert of an encoded event on b, for writers that
// send their whole commit as one batch.
func QueueAppend(b *pgx.Batch, ev *Encoded) {
	b.Queue(qInsertEvent, ev.DID, string(ev.Kind), ev.RevArg(), ev.Body, ev.SeqOffset, ev.BlocksLen, ev.OpsCount)
}

// RevArg is the event's rev as the events.rev column takes it: NULL for
// events without one (#identity, #account).
func (e *Encoded) RevArg() *string {
	if e.Rev == "" {
		return nil
	}
	return &e.Rev
}
