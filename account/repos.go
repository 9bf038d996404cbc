package account

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/repo"
)

//go:embed repos.sql
var reposSQL string

var qListRepos = db.MustParseQueries(reposSQL).MustGet("ListRepos")

// HostedRepo is a hosted repository as com.atproto.sync.listRepos lists it.
type HostedRepo struct {
	DID syntax.DID
	// Head is the CID of the repository's current commit.
	Head cid.Cid
	Rev  string
	// Status is the account's status, or "" when the repository has no
	// account row (its account was deleted, or the server runs without
	// accounts).
	Status Status
}

// ListRepos returns up to limit hosted repositories in DID order, after
// the DID cursor ("" for the first page), with their accounts' status. It
// reads repositories and accounts together, so it takes any q (the pool,
// or a transaction) rather than a Service: a server without accounts lists
// its repositories too.
func ListRepos(ctx context.Context, q db.DBTX, cursor string, limit int) ([]HostedRepo, error) {
	rows, err := q.Query(ctx, qListRepos, cursor, limit)
	if err != nil {
		return nil, fmt.Errorf("listing repos: %w", db.Translate(err))
	}
	var out []HostedRepo
	var did, rev string
	var commitRaw []byte
	var status *string
	_, err = pgx.ForEachRow(rows, []any{&did, &commitRaw, &rev, &status}, func() error {
		c, err := cid.Cast(commitRaw)
		if err != nil {
			return fmt.Errorf("%w: commit cid of %s: %v", repo.ErrCorruptRepo, did, err)
		}
		r := HostedRepo{DID: syntax.DID(did), Head: c, Rev: rev}
		if status != nil {
			r.Status = Status(*status)
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing repos: %w", db.Translate(err))
	}
	return out, nil
}
