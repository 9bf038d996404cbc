package repo

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed reads.sql
var readsSQL string

var reads = db.MustParseQueries(readsSQL)

var (
	qListRecordsAsc  = reads.MustGet("ListRecordsAsc")
	qListRecordsDesc = reads.MustGet("ListRecordsDesc")
	qListNewest      = reads.MustGet("ListRecordsNewest")
	qBlockSizes      = reads.MustGet("BlockSizes")
	qRecordSize      = reads.MustGet("RecordSize")
)

// BlockSizes returns the size in bytes of each of cids that did's current
// repository holds (an MST node or a record; the commit block is the
// head's). CIDs it does not hold are absent from the map. It reads no
// block, so a caller can size what it is about to read, or find what is
// missing, before reading anything.
func (e *Engine) BlockSizes(ctx context.Context, did syntax.DID, cids []cid.Cid) (map[cid.Cid]int, error) {
	raw := make([][]byte, len(cids))
	for i, c := range cids {
		raw[i] = c.Bytes()
	}
	rows, err := e.pool.Query(ctx, qBlockSizes, did.String(), raw)
	if err != nil {
		return nil, fmt.Errorf("sizing blocks: %w", db.Translate(err))
	}
	out := make(map[cid.Cid]int, len(cids))
	var b []byte
	var size int
	_, err = pgx.ForEachRow(rows, []any{&b, &size}, func() error {
		c, err := cid.Cast(b)
		if err != nil {
			return fmt.Errorf("%w: block cid: %v", ErrCorruptRepo, err)
		}
		out[c] = size
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sizing blocks: %w", db.Translate(err))
	}
	return out, nil
}

// RecordSize returns the size in bytes of the record block at
// collection/rkey, or 0 when there is none.
func (e *Engine) RecordSize(ctx context.Context, did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) (int, error) {
	var n int
	err := db.Translate(e.pool.QueryRow(ctx, qRecordSize, did.String(), collection.String(), rkey.String()).Scan(&n))
	if errors.Is(err, db.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sizing record: %w", err)
	}
	return n, nil
}
