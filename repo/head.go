package repo

import (
	"context"
	"errors"
	"fmt"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
)

// Head is a repository's current commit.
type Head struct {
	Commit      cid.Cid
	CommitBytes []byte
	Data        cid.Cid
	Rev         string
}

// InitRepo creates did's empty repository with a signed genesis commit,
// inside tx (the account's creation transaction). It appends no event: the
// caller emits #identity, #account and #sync in the order it wants.
func (e *Engine) InitRepo(ctx context.Context, tx db.DBTX, did syntax.DID, key atcrypto.PrivateKey) (*Head, error) {
	tree := mst.NewEmptyTree()
	diff := newDiffCollector()
	root, err := tree.WriteDiffBlocks(ctx, diff)
	if err != nil {
		return nil, fmt.Errorf("encoding empty MST: %w", err)
	}
	rev := e.nextRev("")
	commitCID, commitBytes, err := signCommit(did, *root, rev, key)
	if err != nil {
		return nil, fmt.Errorf("genesis commit: %w", err)
	}
	tag, err := tx.Exec(ctx, qInsertRoot, did.String(), commitCID.Bytes(), commitBytes, root.Bytes(), rev)
	if err != nil {
		return nil, fmt.Errorf("storing repo root: %w", db.Translate(err))
	}
	if tag.RowsAffected() == 0 {
		return nil, fmt.Errorf("%w: %s", ErrRepoExists, did)
	}
	b := diff.blocks[0]
	if _, err := tx.Exec(ctx, qInsertNodes, did.String(), [][]byte{b.Cid().Bytes()}, rev, [][]byte{b.RawData()}); err != nil {
		return nil, fmt.Errorf("storing empty MST: %w", db.Translate(err))
	}
	return &Head{Commit: commitCID, CommitBytes: commitBytes, Data: *root, Rev: rev}, nil
}

// DeleteRepoTx removes did's repository (records, MST nodes, root) inside
// tx, the account deletion's transaction, and drops its cached tree. Events
// stay in the log until they age out.
func (e *Engine) DeleteRepoTx(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	if _, err := tx.Exec(ctx, qLockRoot, did.String()); err != nil {
		return fmt.Errorf("locking repo root: %w", db.Translate(err))
	}
	for _, q := range qDeleteRepo {
		if _, err := tx.Exec(ctx, q, did.String()); err != nil {
			return fmt.Errorf("deleting repository: %w", db.Translate(err))
		}
	}
	e.cache.drop(did.String())
	return nil
}

// GetHead returns did's current commit.
func (e *Engine) GetHead(ctx context.Context, did syntax.DID) (*Head, error) {
	return getHead(ctx, e.pool, did)
}

func getHead(ctx context.Context, q db.DBTX, did syntax.DID) (*Head, error) {
	var h Head
	var commitRaw, dataRaw []byte
	err := db.Translate(q.QueryRow(ctx, qGetHead, did.String()).Scan(&commitRaw, &h.CommitBytes, &dataRaw, &h.Rev))
	if errors.Is(err, db.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrRepoNotFound, did)
	}
	if err != nil {
		return nil, fmt.Errorf("reading repo head: %w", err)
	}
	var err1, err2 error
	h.Commit, err1 = cid.Cast(commitRaw)
	h.Data, err2 = cid.Cast(dataRaw)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptRepo, err)
	}
	return &h, nil
}

// SyncEvent builds a #sync event for did's current commit (account creation,
// activation, import, repair), read through q so a caller's transaction sees
// its own writes.
func (e *Engine) SyncEvent(ctx context.Context, q db.DBTX, did syntax.DID) (*eventlog.Encoded, error) {
	return SyncEvent(ctx, q, did)
}

// SyncEvent is Engine.SyncEvent for callers without an engine (admin
// repair): it needs only the database.
func SyncEvent(ctx context.Context, q db.DBTX, did syntax.DID) (*eventlog.Encoded, error) {
	h, err := getHead(ctx, q, did)
	if err != nil {
		return nil, err
	}
	car := newCARBuilder(h.Commit)
	car.add(h.Commit, h.CommitBytes)
	return eventlog.EncodeSync(&comatproto.SyncSubscribeRepos_Sync{
		Did:    did.String(),
		Rev:    h.Rev,
		Blocks: car.bytes(),
		Time:   syntax.DatetimeNow().String(),
	})
}
