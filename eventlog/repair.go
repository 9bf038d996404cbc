package eventlog

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/limits"
)

// Event log repair: the operations operators used to do by hand-editing the
// events table, done transactionally, idempotently and audited.

//go:embed repair.sql
var repairSQL string

var (
	repairQueries    = db.MustParseQueries(repairSQL)
	qInspectEvents   = repairQueries.MustGet("InspectEvents")
	qInspectDesc     = repairQueries.MustGet("InspectEventsDesc")
	qEventBody       = repairQueries.MustGet("EventBody")
	qLockEvent       = repairQueries.MustGet("LockEvent")
	qRewriteEvent    = repairQueries.MustGet("RewriteEvent")
	qInvalidateEvent = repairQueries.MustGet("InvalidateEvent")
)

// ErrNotRepairable means the event cannot take the requested repair (for
// example rewriting an #identity as #sync).
var ErrNotRepairable = errors.New("event cannot be repaired that way")

// EventInfo describes a stored event without its blocks.
type EventInfo struct {
	Seq         int64     `json:"seq"`
	DID         string    `json:"did"`
	Kind        Kind      `json:"kind"`
	Rev         string    `json:"rev,omitempty"`
	CreatedAt   time.Time `json:"createdAt"`
	FrameBytes  int       `json:"frameBytes"`
	BlocksBytes int       `json:"blocksBytes"`
	Ops         int       `json:"ops"`
	Invalidated bool      `json:"invalidated"`
	// Problems names each protocol limit the event breaks as stored.
	Problems []string `json:"problems,omitempty"`
}

// EventFilter selects events to inspect. The zero value lists from the start.
type EventFilter struct {
	FromSeq int64
	ToSeq   int64 // 0 = no upper bound
	DID     string
	Kind    Kind
	// OverLimits keeps only events that break a protocol limit.
	OverLimits bool
	// Newest lists from ToSeq (or the newest event) down to FromSeq.
	Newest bool
	Limit  int // default 100, at most 1000
}

// Inspect lists sequenced events matching f, in seq order (newest first
// with f.Newest).
func (l *Log) Inspect(ctx context.Context, f EventFilter) ([]EventInfo, error) {
	if f.Limit <= 0 || f.Limit > 1000 {
		f.Limit = min(max(f.Limit, 100), 1000)
	}
	query := qInspectEvents
	if f.Newest {
		query = qInspectDesc
	}
	var out []EventInfo
	from, to := f.FromSeq, f.ToSeq
	for len(out) < f.Limit {
		rows, err := l.pool.Query(ctx, query, from, to, f.DID, string(f.Kind), f.Limit)
		if err != nil {
			return nil, fmt.Errorf("inspecting events: %w", db.Translate(err))
		}
		page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (EventInfo, error) {
			var e EventInfo
			var kind string
			var bodyLen int
			err := row.Scan(&e.Seq, &e.DID, &kind, &e.Rev, &e.CreatedAt, &bodyLen, &e.BlocksBytes, &e.Ops, &e.Invalidated)
			e.Kind = Kind(kind)
			e.FrameBytes = len(headerBytes[e.Kind]) + bodyLen
			e.Problems = problems(e.Kind, e.FrameBytes, e.BlocksBytes, e.Ops)
			return e, err
		})
		if err != nil {
			return nil, fmt.Errorf("inspecting events: %w", db.Translate(err))
		}
		for _, e := range page {
			if !f.OverLimits || len(e.Problems) > 0 {
				out = append(out, e)
			}
		}
		if len(page) < f.Limit || !f.OverLimits {
			break
		}
		if f.Newest {
			if to = page[len(page)-1].Seq - 1; to < max(from, 1) {
				break
			}
		} else {
			from = page[len(page)-1].Seq + 1
		}
	}
	if len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// Ops returns the operations of the #commit at seq (invalidated or not):
// nil for another kind of event, ErrNoEvent when there is none.
func (l *Log) Ops(ctx context.Context, seq int64) ([]Op, error) {
	var kind string
	var body []byte
	err := db.Translate(l.pool.QueryRow(ctx, qEventBody, seq).Scan(&kind, &body))
	if errors.Is(err, db.ErrNotFound) {
		return nil, ErrNoEvent
	}
	if err != nil {
		return nil, fmt.Errorf("reading event %d: %w", seq, err)
	}
	if Kind(kind) != KindCommit {
		return nil, nil
	}
	ops, err := readOps(body)
	if err != nil {
		return nil, fmt.Errorf("reading event %d: %w", seq, err)
	}
	return ops, nil
}

// problems names the protocol limits an event of this shape breaks.
func problems(kind Kind, frame, blocks, ops int) []string {
	var p []string
	if frame > limits.MaxFrameBytes {
		p = append(p, fmt.Sprintf("frame is %d bytes; relays drop the connection above %d", frame, limits.MaxFrameBytes))
	}
	switch kind {
	case KindCommit:
		if blocks > limits.MaxCommitBlocksBytes {
			p = append(p, fmt.Sprintf("blocks are %d bytes; relays drop commits above %d", blocks, limits.MaxCommitBlocksBytes))
		}
		if ops > limits.MaxCommitOps {
			p = append(p, fmt.Sprintf("%d ops; relays drop commits above %d", ops, limits.MaxCommitOps))
		}
	case KindSync:
		if blocks > limits.MaxSyncBlocksBytes {
			p = append(p, fmt.Sprintf("#sync blocks are %d bytes; the lexicon allows %d", blocks, limits.MaxSyncBlocksBytes))
		}
	}
	return p
}

// RepairResult reports one repair.
type RepairResult struct {
	Seq     int64      `json:"seq"`
	Changed bool       `json:"changed"`
	Before  *EventInfo `json:"before,omitempty"`
	After   *EventInfo `json:"after,omitempty"`
}

// RewriteAsSync replaces the event at seq, a #commit (or an oversized
// #sync), with a #sync of the same repo at the same rev whose blocks hold
// only the signed commit, keeping its seq. Consumers that stall on the event
// then re-fetch the repo instead. Running it on an event that is already a
// compliant #sync changes nothing.
func (l *Log) RewriteAsSync(ctx context.Context, seq int64, actor, reason string) (*RepairResult, error) {
	return l.repair(ctx, seq, "firehose.rewriteAsSync", actor, reason, func(ev *Event) (*Encoded, bool, error) {
		if ev.Kind == KindSync && !Oversized(ev) {
			return nil, false, nil
		}
		if ev.Kind != KindCommit && ev.Kind != KindSync {
			return nil, false, fmt.Errorf("%w: #%s event %d is not a commit", ErrNotRepairable, ev.Kind, seq)
		}
		s, err := syncFromStored(ev)
		if err != nil {
			return nil, false, err
		}
		enc, err := EncodeSync(s)
		return enc, true, err
	})
}

// Invalidate stops the event at seq from being served; consumers skip it (a
// gap in seqs is allowed by the protocol). Invalidating twice changes nothing.
func (l *Log) Invalidate(ctx context.Context, seq int64, actor, reason string) (*RepairResult, error) {
	return l.repair(ctx, seq, "firehose.invalidate", actor, reason, func(*Event) (*Encoded, bool, error) {
		return nil, true, nil
	})
}

// repair runs one audited change to the event at seq. change returns the
// replacement body (nil to invalidate instead) and whether anything changes.
func (l *Log) repair(ctx context.Context, seq int64, action, actor, reason string, change func(*Event) (*Encoded, bool, error)) (*RepairResult, error) {
	res := &RepairResult{Seq: seq}
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		ev := Event{Seq: seq}
		var kind string
		var invalidated bool
		err := db.Translate(tx.QueryRow(ctx, qLockEvent, seq).Scan(&ev.DID, &kind, &ev.Rev, &ev.Body, &ev.SeqOffset, &ev.BlocksLen, &ev.OpsCount, &invalidated))
		if errors.Is(err, db.ErrNotFound) {
			return fmt.Errorf("%w: seq %d", ErrNoEvent, seq)
		}
		if err != nil {
			return fmt.Errorf("locking event %d: %w", seq, err)
		}
		ev.Kind = Kind(kind)
		before := info(&ev, invalidated)
		res.Before = &before
		if invalidated {
			// Nothing is served from an invalidated event: no repair applies.
			return nil
		}
		enc, changed, err := change(&ev)
		if err != nil || !changed {
			return err
		}
		after := before
		if enc == nil {
			if _, err := tx.Exec(ctx, qInvalidateEvent, seq); err != nil {
				return fmt.Errorf("invalidating event %d: %w", seq, db.Translate(err))
			}
			after.Invalidated = true
		} else {
			if _, err := tx.Exec(ctx, qRewriteEvent, seq, string(enc.Kind), enc.Body, enc.SeqOffset, enc.BlocksLen, enc.OpsCount); err != nil {
				return fmt.Errorf("rewriting event %d: %w", seq, db.Translate(err))
			}
			after = info(&Event{Seq: seq, DID: ev.DID, Kind: enc.Kind, Rev: enc.Rev, Body: enc.Body, BlocksLen: enc.BlocksLen, OpsCount: enc.OpsCount}, false)
		}
		res.Changed, res.After = true, &after
		return audit.Record(ctx, tx, &audit.Entry{
			Actor: actor, Action: action, Subject: fmt.Sprintf("seq:%d", seq),
			Before: before, After: after, Reason: reason,
		})
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func info(ev *Event, invalidated bool) EventInfo {
	fs := ev.FrameSize()
	return EventInfo{
		Seq: ev.Seq, DID: ev.DID, Kind: ev.Kind, Rev: ev.Rev, FrameBytes: fs,
		BlocksBytes: ev.BlocksLen, Ops: ev.OpsCount, Invalidated: invalidated,
		Problems: problems(ev.Kind, fs, ev.BlocksLen, ev.OpsCount),
	}
}

// syncFromStored builds the #sync that stands for a stored #commit or #sync:
// same repo, rev and time, with a CAR holding only the signed commit block.
func syncFromStored(ev *Event) (*comatproto.SyncSubscribeRepos_Sync, error) {
	if ev.Kind != KindCommit && ev.Kind != KindSync {
		return nil, fmt.Errorf("%w: #%s has no commit", ErrNotRepairable, ev.Kind)
	}
	f, err := readStoredFields(ev.Body)
	if err != nil {
		return nil, fmt.Errorf("decoding stored #%s %d: %w", ev.Kind, ev.Seq, err)
	}
	commitCAR, err := commitOnlyCAR(f.blocks)
	if err != nil {
		return nil, err
	}
	return &comatproto.SyncSubscribeRepos_Sync{Did: f.did, Rev: f.rev, Blocks: commitCAR, Time: f.time}, nil
}

// RepairOversized rewrites every valid event that breaks a protocol limit as
// #sync and returns what it changed.
func (l *Log) RepairOversized(ctx context.Context, actor, reason string) ([]RepairResult, error) {
	var out []RepairResult
	var from int64
	for {
		bad, err := l.Inspect(ctx, EventFilter{FromSeq: from, OverLimits: true, Limit: 1000})
		if err != nil {
			return out, err
		}
		for _, e := range bad {
			if e.Invalidated {
				continue
			}
			r, err := l.RewriteAsSync(ctx, e.Seq, actor, reason)
			if err != nil {
				return out, err
			}
			if r.Changed {
				out = append(out, *r)
			}
		}
		if len(bad) < 1000 {
			return out, nil
		}
		from = bad[len(bad)-1].Seq + 1
	}
}

// RaiseSeqAudited is RaiseSeq with an audit entry, in one transaction.
func (l *Log) RaiseSeqAudited(ctx context.Context, floor int64, actor, reason string) (before, after int64, err error) {
	err = pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, qLockSequencer).Scan(&before); err != nil {
			return fmt.Errorf("reading last seq: %w", db.Translate(err))
		}
		var err error
		if after, err = RaiseSeq(ctx, tx, floor); err != nil {
			return err
		}
		if after == before {
			return nil
		}
		return audit.Record(ctx, tx, &audit.Entry{
			Actor: actor, Action: "firehose.raiseSeq", Subject: "sequencer",
			Before: map[string]int64{"lastSeq": before}, After: map[string]int64{"lastSeq": after}, Reason: reason,
		})
	})
	return before, after, err
}

// SyncSource builds the #sync event for did's current commit, read through
// q so that it sees the caller's transaction (the repository engine's
// SyncEvent).
type SyncSource func(ctx context.Context, q db.DBTX, did syntax.DID) (*Encoded, error)

// EmitSync appends a fresh #sync for did, built by sync from the repository
// as it stands, with an audit entry, in one transaction: consumers that lost
// track of the repository re-fetch it. It returns the rev announced.
func (l *Log) EmitSync(ctx context.Context, did syntax.DID, sync SyncSource, actor, reason string) (string, error) {
	var rev string
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		ev, err := sync(ctx, tx, did)
		if err != nil {
			return err
		}
		if err := Append(ctx, tx, ev); err != nil {
			return err
		}
		rev = ev.Rev
		return audit.Record(ctx, tx, &audit.Entry{
			Actor: actor, Action: "firehose.emitSync", Subject: did.String(),
			After: map[string]string{"rev": ev.Rev}, Reason: reason,
		})
	})
	if err != nil {
		return "", err
	}
	return rev, nil
}
