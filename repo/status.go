package repo

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed status.sql
var statusSQL string

var qCountBlocks = db.MustParseQueries(statusSQL).MustGet("CountBlocks")

// CountBlocks returns how many blocks did's current repository holds:
// MST nodes, distinct record blocks and the commit (what a whole getRepo
// CAR carries; com.atproto.server.checkAccountStatus's repoBlocks).
func (e *Engine) CountBlocks(ctx context.Context, did syntax.DID) (int64, error) {
	var n int64
	if err := e.pool.QueryRow(ctx, qCountBlocks, did.String()).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting blocks: %w", db.Translate(err))
	}
	return n, nil
}
