package repo

import (
	"context"
	"errors"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

// Apply commits writes to did's repository as one signed commit and appends
// its #commit event, in one transaction. swapCommit, when set, must be the
// current commit. Nothing is stored if any check fails. A commit whose writes
// change nothing (updates to identical records) is not stored; the current
// head is returned.
func (e *Engine) Apply(ctx context.Context, did syntax.DID, writes []Write, swapCommit *cid.Cid) (*CommitResult, error) {
	return e.ApplyGuarded(ctx, did, writes, swapCommit, nil)
}

// Guard is a statement run first in a commit's transaction, before the
// repo is locked or anything is written; if it fails (raises), nothing is
// stored and Apply returns its error. The XRPC layer uses one to check the
// writer's session and account status in the commit's own transaction
// instead of in a round trip of its own.
type Guard struct {
	SQL  string
	Args []any
}

// ApplyGuarded is Apply with a guard statement (nil for none).
func (e *Engine) ApplyGuarded(ctx context.Context, did syntax.DID, writes []Write, swapCommit *cid.Cid, guard *Guard) (*CommitResult, error) {
	prepared, err := e.prepare(writes)
	if err != nil {
		return nil, err
	}
	key, err := e.keys.SigningKey(ctx, did)
	if err != nil {
		return nil, err
	}
	leave, err := e.enter(ctx, did.String())
	if err != nil {
		return nil, err
	}
	defer leave()
	active := e.active.Add(1)
	defer e.active.Add(-1)
	lc := &lazyConn{pool: e.pool}
	defer lc.release()
	res, newState, cached, done, err := e.applyOptimistic(ctx, lc, did, key, prepared, swapCommit, guard, active)
	if err != nil {
		return nil, err
	}
	if !done {
		conn, err := lc.get(ctx)
		if err != nil {
			return nil, fmt.Errorf("acquiring a connection: %w", db.Translate(err))
		}
		res, newState, err = e.applyTx(ctx, conn, did, key, prepared, swapCommit, guard, cached)
		if err != nil {
			rollback(ctx, conn)
			return nil, err
		}
	}
	if newState != nil {
		e.cache.put(newState)
		if e.waker != nil {
			e.waker.Wake()
		}
		e.sendHint(did.String(), res)
	}
	return res, nil
}

// writerQueue admits one of this process's writers of a repo at a time.
type writerQueue struct {
	turn    chan struct{} // holds a token while a writer is in
	waiting int           // writers in or waiting; guarded by writersMu
}

// enter waits for did's turn among this process's writers (first come,
// first served) and returns the function that ends it.
func (e *Engine) enter(ctx context.Context, did string) (func(), error) {
	e.writersMu.Lock()
	q := e.writers[did]
	if q == nil {
		q = &writerQueue{turn: make(chan struct{}, 1)}
		e.writers[did] = q
	}
	q.waiting++
	e.writersMu.Unlock()
	done := func() {
		e.writersMu.Lock()
		if q.waiting--; q.waiting == 0 {
			delete(e.writers, did)
		}
		e.writersMu.Unlock()
	}
	select {
	case q.turn <- struct{}{}:
		return func() { <-q.turn; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}

// applyOptimistic commits in one round trip when this process holds the
// repo's tree in its cache (the writer's turn, see enter, guarantees no
// other writer of this process has it out): the commit is built from the
// cached state and sent as one pipelined batch with no BEGIN or COMMIT (the
// statements of a pipeline up to its Sync run as one implicit transaction,
// committed at the Sync, or rolled back whole if any statement fails).
// bulwark_try_commit first takes the repo row lock and moves the root
// from the cached commit to the new one; when another process had moved
// it, it stores nothing and answers what the cache lacks, and the commit
// is undone, the tree caught up and the commit rebuilt (a refresh, not a
// reload: refresh.go), up to maxRefreshes times. A repository that
// another process moved recently is checked before the commit is worked
// out (checkMoved), so that it is worked out once. done is false when the
// fast path does not apply; the caller then takes the two-round-trip
// path, which reads the root inside the lock. Commits whose records touch
// blob references take that path too, since the blob tracker needs the
// transaction open. While other commits are in flight, the batch joins a
// group of them (group.go).
//
// When it is not done, cached is the cached state, if there is one still
// usable, for the locked path to catch up rather than load the tree whole.
func (e *Engine) applyOptimistic(ctx context.Context, lc *lazyConn, did syntax.DID, key atcrypto.PrivateKey, writes []preparedWrite, swapCommit *cid.Cid, guard *Guard, active int64) (res *CommitResult, newState, cached *repoState, done bool, err error) {
	e.pollHints()
	st := e.cache.takeAny(did.String())
	if st == nil || !st.commit.Defined() {
		return nil, nil, nil, false, nil
	}
	if e.followHints(ctx, st); st.torn {
		return nil, nil, nil, false, nil
	}
	if e.blobs != nil {
		for _, w := range writes {
			if w.Action != ActionCreate || len(atdata.ExtractBlobs(w.Record)) > 0 {
				return nil, nil, st, false, nil
			}
		}
	}
	if st.checks > 0 {
		if st, err = e.checkMoved(ctx, did, st); st == nil || err != nil {
			return nil, nil, nil, err != nil, err
		}
	}
	for attempt := 0; ; attempt++ {
		if swapCommit != nil && !swapCommit.Equals(st.commit) {
			// The two-round-trip path reports the swap against the database.
			return nil, nil, st, false, nil
		}
		p, err := e.plan(ctx, st, did, key, writes)
		if err != nil || p.params == nil {
			// The cached state may be stale: let the locked path decide.
			return nil, nil, usable(st), false, nil
		}
		p.params.freshNodes = true
		p.params.oldRev = st.rev
		var moved [][]byte
		if e.useGroup(active) {
			moved, err = e.storeGrouped(ctx, lc, guard, p.params)
		} else if conn, cerr := lc.get(ctx); cerr != nil {
			err = cerr
		} else {
			moved, err = storeTry(ctx, conn, guard, p.params)
		}
		if err = db.Translate(err); err != nil {
			if errors.Is(err, db.ErrRootMoved) || errors.Is(err, db.ErrConflict) {
				// The repo is gone, or (unique violation) a node the cache
				// did not know of is stored: the locked path redoes the
				// commit from the database.
				e.counters.staleRoots.Inc()
				return nil, nil, nil, false, nil
			}
			return nil, nil, nil, true, fmt.Errorf("storing commit: %w", err)
		}
		if moved == nil {
			p.finish()
			e.fastCommits.Add(1)
			return p.res, st, nil, true, nil
		}
		// Another process moved the root: undo the commit, catch the tree
		// up and build the commit again.
		e.counters.staleRoots.Inc()
		if p.undo() != nil {
			return nil, nil, nil, false, nil
		}
		if attempt >= maxRefreshes {
			return nil, nil, st, false, nil
		}
		if !e.refresh(ctx, e.pool, st, moved) {
			return nil, nil, nil, false, nil
		}
	}
}

// checkMoved asks whether another process moved did's repository on from
// st (one read, bulwark_repo_since) and, if it did, catches st up. It
// returns the state to work the commit out on, or nil when there is none
// (st could not be caught up, or the repository is gone): the locked
// path then loads the tree, or says what became of the repository.
func (e *Engine) checkMoved(ctx context.Context, did syntax.DID, st *repoState) (*repoState, error) {
	e.counters.checks.Inc()
	var moved [][]byte
	err := db.TranslateCall(e.pool.QueryRow(ctx, qRepoSince, did.String(), st.commit.Bytes(), st.rev).Scan(&moved))
	switch {
	case errors.Is(err, db.ErrRootMoved):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the repo's root: %w", err)
	case moved == nil:
		st.checks--
		return st, nil
	case e.refresh(ctx, e.pool, st, moved):
		return st, nil
	}
	return nil, nil
}

// usable is st, unless a plan left it torn.
func usable(st *repoState) *repoState {
	if st.torn {
		return nil
	}
	return st
}

// rollback ends a commit transaction that failed part-way. A connection
// that cannot even roll back is closed, so the pool never hands out one in
// the middle of a transaction.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	ctx = context.WithoutCancel(ctx)
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}

// applyTx runs one commit on conn in two round trips: BEGIN with the row
// lock and the root read, then every write with COMMIT at the end (plus the
// blob tracker's statements, when a record references blobs). cached, when
// not nil, is this process's cached state of the repo, caught up to the
// locked root rather than the tree loaded whole. On an error the caller
// rolls back.
func (e *Engine) applyTx(ctx context.Context, conn *pgxpool.Conn, did syntax.DID, key atcrypto.PrivateKey, writes []preparedWrite, swapCommit *cid.Cid, guard *Guard, cached *repoState) (*CommitResult, *repoState, error) {
	var commitRaw, dataRaw []byte
	var oldRev string
	begin := &pgx.Batch{}
	begin.Queue("BEGIN")
	begin.Queue(qHoldLockBriefly)
	if guard != nil {
		begin.Queue(guard.SQL, guard.Args...)
	}
	begin.Queue(qLockRoot, did.String()).QueryRow(func(row pgx.Row) error {
		return row.Scan(&commitRaw, &dataRaw, &oldRev)
	})
	// What the cached tree lacks, if anything, read under the lock.
	var since [][]byte
	if cached != nil {
		begin.Queue(qRepoSince, did.String(), cached.commit.Bytes(), cached.rev).QueryRow(func(row pgx.Row) error {
			return row.Scan(&since)
		})
	}
	err := db.TranslateCall(conn.SendBatch(ctx, begin).Close())
	if errors.Is(err, db.ErrNotFound) || errors.Is(err, db.ErrRootMoved) {
		return nil, nil, fmt.Errorf("%w: %s", ErrRepoNotFound, did)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("locking repo root: %w", err)
	}
	oldCommit, err := cid.Cast(commitRaw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: commit cid: %v", ErrCorruptRepo, err)
	}
	oldData, err := cid.Cast(dataRaw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: data cid: %v", ErrCorruptRepo, err)
	}
	if swapCommit != nil && !swapCommit.Equals(oldCommit) {
		return nil, nil, fmt.Errorf("%w: the repo's commit is %s, not %s", ErrInvalidSwap, oldCommit, swapCommit)
	}

	st, err := e.lockedState(ctx, conn, did.String(), cached, &movedRoot{commit: oldCommit, data: oldData, rev: oldRev}, since)
	if err != nil {
		return nil, nil, err
	}
	p, err := e.plan(ctx, st, did, key, writes)
	if err != nil {
		return nil, nil, err
	}
	if p.params == nil {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return nil, nil, fmt.Errorf("ending an empty commit: %w", db.Translate(err))
		}
		return p.res, nil, nil
	}
	// The blob tracker may refuse the commit (a reference to a blob never
	// uploaded), so it runs before the batch that ends in COMMIT.
	if e.blobs != nil {
		if err := e.blobs.TrackTx(ctx, conn, did, p.res.Rev, p.blobChanges); err != nil {
			return nil, nil, err
		}
	}
	b := &pgx.Batch{}
	queue(b, nil, p.params)
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, fmt.Errorf("storing commit: %w", db.TranslateCall(err))
	}
	p.finish()
	return p.res, st, nil
}
