package repo

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

// A lone writer waits for every step of its commit in turn: the MST diff,
// the signature and the event in Go, then the statements and the WAL flush
// in Postgres. A split commit overlaps the two: the tree's rows
// (bulwark_commit_tree, migrations/00009) go to the server as soon as the
// diff is known, and the server stores them while this process signs the
// commit and encodes its event; the second statement (bulwark_commit_head:
// the root and the event) and the Sync follow. Both statements are one
// pipeline up to one Sync, so one implicit transaction: they commit
// together or not at all. If the commit cannot be finished after the first
// statement went out (a size limit found while encoding the event, a
// signing error), a statement that raises errAbandoned takes the place of
// the second, and the server rolls the first back.
//
// The split costs the server a second statement (~20 µs), so it is used
// only when the commit is the engine's only one in flight, where it
// shortens the wait; concurrent commits keep the CPU-cheaper single call.

// Split modes (Config.split): SplitAuto splits a commit when no other
// commit of this engine is in flight; the others are for the benchmarks'
// comparison.
const (
	splitAuto = iota
	splitNever
	splitAlways
)

// errAbandoned is the SQLSTATE qAbandon raises.
const errAbandoned = "BW003"

const qAbandon = `DO $$BEGIN RAISE EXCEPTION 'commit abandoned before it was signed' USING ERRCODE = 'BW003'; END$$`

var (
	qCommitTree = queries.MustGet("CommitTree")
	qCommitHead = queries.MustGet("CommitHead")
)

// useSplit reports whether a commit that found active commits in flight
// (itself included) should be split.
func (e *Engine) useSplit(active int64) bool {
	switch e.split {
	case splitNever:
		return false
	case splitAlways:
		return true
	}
	return active == 1 && !e.perStatement && !e.globalLock
}

// useGroup reports whether a commit that found active commits in flight
// should be stored in a group (group.go).
func (e *Engine) useGroup(active int64) bool {
	return active > 1 && e.group.maxLeaders > 0 && !e.perStatement && !e.globalLock
}

// pipelineSender queues prepared statements on a pipeline.
type pipelineSender struct {
	conn *pgx.Conn
	pl   *pgconn.Pipeline
	eqb  pgx.ExtendedQueryBuilder
}

func (s *pipelineSender) send(ctx context.Context, sql string, args ...any) error {
	sd, err := s.conn.Prepare(ctx, sql, sql)
	if err != nil {
		return err
	}
	if err := s.eqb.Build(s.conn.TypeMap(), sd, args); err != nil {
		return err
	}
	// The pipeline keeps the result formats until the result is read; the
	// builder reuses its slice for the next statement.
	s.pl.SendQueryStatement(sd, s.eqb.ParamValues, s.eqb.ParamFormats, slices.Clone(s.eqb.ResultFormats))
	return nil
}

// applySplit is applyOptimistic's commit sent in two parts (see above). It
// returns done false, with nothing stored, when the cached tree turned out
// stale; the caller then takes the locked path.
func (e *Engine) applySplit(ctx context.Context, conn *pgxpool.Conn, st *repoState, did syntax.DID, key atcrypto.PrivateKey, writes []preparedWrite, guard *Guard) (*CommitResult, *repoState, bool, error) {
	built := st.commit
	tp, err := e.planTree(ctx, st, did, writes)
	if err != nil || tp.unchanged != nil {
		// The cached state may be stale: let the locked path decide.
		return nil, nil, false, nil
	}
	c := conn.Conn()
	// Statements are prepared (once per connection) before the pipeline
	// starts: a pipeline cannot wait for a statement's description.
	for _, q := range []string{qCommitTree, qCommitHead} {
		if _, err := c.Prepare(ctx, q, q); err != nil {
			return nil, nil, true, fmt.Errorf("preparing commit: %w", db.Translate(err))
		}
	}
	if guard != nil {
		if _, err := c.Prepare(ctx, guard.SQL, guard.SQL); err != nil {
			return nil, nil, true, fmt.Errorf("preparing commit guard: %w", db.Translate(err))
		}
	}
	r := tp.rows
	s := &pipelineSender{conn: c, pl: c.PgConn().StartPipeline(ctx)}
	err = nil
	if guard != nil {
		err = s.send(ctx, guard.SQL, guard.Args...)
	}
	if err == nil {
		err = s.send(ctx, qCommitTree, r.did, built.Bytes(), r.rev, r.rmNodes, r.nodeCIDs, r.nodeData,
			r.delCols, r.delRKeys, r.upCols, r.upRKeys, r.upCIDs, r.upData)
	}
	if err == nil {
		err = s.pl.Flush()
	}
	if err != nil {
		// Nothing was sent, or the connection failed: either way it is
		// not reused.
		_ = s.pl.Close()
		_ = c.Close(context.WithoutCancel(ctx))
		return nil, nil, true, fmt.Errorf("storing commit: %w", db.Translate(err))
	}

	p, sealErr := tp.seal(key)
	if sealErr == nil {
		ev := p.rows.ev
		sealErr = s.send(ctx, qCommitHead, r.did, r.commitCID, r.commit, r.data, r.rev,
			string(ev.Kind), ev.RevArg(), ev.Body, ev.SeqOffset, ev.BlocksLen, ev.OpsCount)
	}
	if sealErr != nil {
		s.pl.SendQueryParams(qAbandon, nil, nil, nil, nil)
	}
	s.pl.SendPipelineSync()
	if err := s.pl.Flush(); err != nil {
		_ = s.pl.Close()
		_ = c.Close(context.WithoutCancel(ctx))
		return nil, nil, true, fmt.Errorf("storing commit: %w", db.Translate(err))
	}
	err = s.pl.Close()
	var pe *pgconn.PgError
	switch {
	case err == nil && sealErr == nil:
		p.finish()
		e.fastCommits.Add(1)
		return p.res, st, true, nil
	case errors.As(err, &pe) && pe.Code == errAbandoned:
		return nil, nil, true, sealErr
	case errors.As(err, &pe) && pe.Code == errRootMoved:
		e.staleRoots.Add(1)
		return nil, nil, false, nil
	case err == nil:
		// The server committed although the abandon statement was sent:
		// cannot happen, but must not pass silently.
		return nil, nil, true, fmt.Errorf("storing commit: abandoned commit was not rolled back (%v)", sealErr)
	case pe == nil:
		_ = c.Close(context.WithoutCancel(ctx))
	}
	return nil, nil, true, fmt.Errorf("storing commit: %w", db.Translate(err))
}
