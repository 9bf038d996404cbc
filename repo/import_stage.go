package repo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

// Chunks in which the CAR's blocks are copied into the staging table.
const (
	// stageChunkBytes is about how many bytes of blocks are held before
	// they are copied: each COPY is a short statement with data in hand,
	// never one waiting on the client.
	stageChunkBytes = 4 << 20
	// stageChunkRows bounds the blocks of one chunk.
	stageChunkRows = 10_000
	// stagingCleanup bounds dropping the staging tables at the end.
	stagingCleanup = 30 * time.Second
	// maxRevSkew is how far in the future an imported commit's rev may
	// be dated (clocks differ between servers).
	maxRevSkew = 5 * time.Minute
)

// open takes the import's connection and creates its staging tables.
func (imp *importer) open(ctx context.Context) error {
	conn, err := imp.e.sessions.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquiring a connection for the import: %w", db.Translate(err))
	}
	imp.conn = conn
	b := &pgx.Batch{}
	for _, q := range qImportCreate {
		b.Queue(q)
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("creating import staging: %w", db.Translate(err))
	}
	return nil
}

// close drops the staging tables and gives the connection back. A
// connection whose tables cannot be dropped is closed instead, which drops
// them with its session, so the pool never hands out a session holding
// another import's blocks.
func (imp *importer) close(ctx context.Context) {
	if imp.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stagingCleanup)
	defer cancel()
	if _, err := imp.conn.Exec(ctx, qImportDropStaging); err != nil {
		imp.e.log.Warn("dropping import staging failed; closing its connection", "did", imp.did, "error", err)
		_ = imp.conn.Conn().Close(ctx)
	}
	imp.conn.Release()
}

// stage copies the CAR's blocks into import_blocks as they arrive,
// checking each, then indexes them, and returns the root block. A chunk
// of blocks is held in memory and copied once full, so no statement is
// open while the client sends.
func (imp *importer) stage(ctx context.Context, cr *carReader, root cid.Cid) ([]byte, error) {
	var commit []byte
	rows := make([][]any, 0, 1024)
	size := 0
	flush := func() error {
		if len(rows) == 0 {
			return nil
		}
		if _, err := imp.conn.CopyFrom(ctx, pgx.Identifier{"import_blocks"}, []string{"cid", "data"}, pgx.CopyFromRows(rows)); err != nil {
			return fmt.Errorf("staging import blocks: %w", db.Translate(err))
		}
		clear(rows)
		rows, size = rows[:0], 0
		return nil
	}
	for {
		c, raw, data, err := cr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if commit == nil && c.Equals(root) {
			commit = bytes.Clone(data)
		}
		rows = append(rows, []any{bytes.Clone(raw), bytes.Clone(data)})
		size += len(raw) + len(data)
		if size >= stageChunkBytes || len(rows) >= stageChunkRows {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	imp.res.Blocks, imp.res.Bytes = cr.blocks, cr.n.n
	if commit == nil {
		return nil, fmt.Errorf("%w: the CAR does not hold its root block %s", ErrInvalidImport, root)
	}
	for _, q := range []string{qImportIndexBlocks, qImportAnalyzeBlocks} {
		if _, err := imp.conn.Exec(ctx, q); err != nil {
			return nil, fmt.Errorf("indexing import blocks: %w", db.Translate(err))
		}
	}
	return commit, nil
}

// checkCommit parses the root commit and checks that it is a well-formed
// commit of the importing account. Its signature is the old server's and
// is not checked: the caller has proved they own the account, and the
// tree is signed anew.
func (imp *importer) checkCommit(block []byte, root cid.Cid) (*atrepo.Commit, error) {
	var c atrepo.Commit
	if err := c.UnmarshalCBOR(bytes.NewReader(block)); err != nil {
		return nil, fmt.Errorf("%w: root block %s is not a repository commit: %v", ErrInvalidImport, root, err)
	}
	if err := c.VerifyStructure(); err != nil {
		return nil, fmt.Errorf("%w: root commit %s: %v", ErrInvalidImport, root, err)
	}
	// A rev is a TID, a time: one in the future would carry every later
	// rev of the repository there with it, and relays refuse commits
	// from the future.
	if rev, _ := syntax.ParseTID(c.Rev); rev.Time().After(time.Now().Add(maxRevSkew)) {
		return nil, fmt.Errorf("%w: root commit %s has rev %s, dated %s, in the future", ErrInvalidImport, root, c.Rev, rev.Time().UTC().Format(time.RFC3339))
	}
	if c.DID != imp.did.String() {
		return nil, fmt.Errorf("%w: the CAR's commit is for %s, not for this account (%s)", ErrInvalidImport, c.DID, imp.did)
	}
	if !c.Data.Defined() {
		return nil, fmt.Errorf("%w: root commit %s has no data root", ErrInvalidImport, root)
	}
	return &c, nil
}
