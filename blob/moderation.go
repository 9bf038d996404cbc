package blob

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed moderation.sql
var moderationSQL string

var qBlobKnown = db.MustParseQueries(moderationSQL).MustGet("BlobKnown")

// Known reports whether did uploaded the blob or one of its records refers
// to it: com.atproto.admin.getSubjectStatus answers for such blobs only.
func (s *Service) Known(ctx context.Context, did syntax.DID, c cid.Cid) (bool, error) {
	var ok bool
	if err := s.pool.QueryRow(ctx, qBlobKnown, did.String(), c.String()).Scan(&ok); err != nil {
		return false, fmt.Errorf("looking up blob: %w", db.Translate(err))
	}
	return ok, nil
}
