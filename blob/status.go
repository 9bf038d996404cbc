package blob

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed status.sql
var statusSQL string

var qBlobCounts = db.MustParseQueries(statusSQL).MustGet("BlobCounts")

// Counts returns how many distinct blobs did's records refer to
// (expected) and how many of those are stored (imported): after a
// migration, expected > imported until every blob has been uploaded again.
func (s *Service) Counts(ctx context.Context, did syntax.DID) (expected, imported int64, err error) {
	if err := s.pool.QueryRow(ctx, qBlobCounts, did.String()).Scan(&expected, &imported); err != nil {
		return 0, 0, fmt.Errorf("counting blobs: %w", db.Translate(err))
	}
	return expected, imported, nil
}
