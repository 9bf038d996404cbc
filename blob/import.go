package blob

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/repo"
)

//go:embed import.sql
var importSQL string

var importQueries = db.MustParseQueries(importSQL)

var (
	qImportDropRefs            = importQueries.MustGet("ImportDropRefs")
	qImportAddRefs             = importQueries.MustGet("ImportAddRefs")
	qImportKeepReferenced      = importQueries.MustGet("ImportKeepReferenced")
	qImportReleaseUnreferenced = importQueries.MustGet("ImportReleaseUnreferenced")
)

var _ repo.BlobImporter = (*Service)(nil)

// DropRefsTx forgets every blob reference of did's records, inside a
// repository import's transaction (repo.BlobImporter).
func (s *Service) DropRefsTx(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	if _, err := tx.Exec(ctx, qImportDropRefs, did.String()); err != nil {
		return fmt.Errorf("dropping blob references: %w", db.Translate(err))
	}
	return nil
}

// AddRefsTx records an imported repository's blob references
// (repo.BlobImporter). Unlike TrackTx it accepts references to blobs did
// has not uploaded: the blobs of a migrating account arrive after its
// repository, and listMissingBlobs lists them until they do.
func (s *Service) AddRefsTx(ctx context.Context, tx db.DBTX, did syntax.DID, rev string, refs []repo.BlobRef) error {
	paths := make([]string, len(refs))
	cids := make([]string, len(refs))
	for i, r := range refs {
		paths[i], cids[i] = r.Path, r.CID
	}
	if _, err := tx.Exec(ctx, qImportAddRefs, did.String(), paths, cids, rev); err != nil {
		return fmt.Errorf("recording blob references: %w", db.Translate(err))
	}
	return nil
}

// SettleRefsTx ends an import's reference changes (repo.BlobImporter):
// uploaded blobs the new records refer to become permanent, and those no
// record refers to any more start their expiry, as TrackTx does for a
// commit.
func (s *Service) SettleRefsTx(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	for _, q := range []string{qImportKeepReferenced, qImportReleaseUnreferenced} {
		if _, err := tx.Exec(ctx, q, did.String()); err != nil {
			return fmt.Errorf("settling imported blob references: %w", db.Translate(err))
		}
	}
	return nil
}
