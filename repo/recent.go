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

//go:embed recent.sql
var recentSQL string

var (
	recentQueries = db.MustParseQueries(recentSQL)
	qGetRev       = recentQueries.MustGet("GetRev")
	qPostsSince   = recentQueries.MustGet("PostsSince")
	qProfileSince = recentQueries.MustGet("ProfileSince")
)

// Collections read-after-write looks at.
const (
	postCollection    syntax.NSID      = "app.bsky.feed.post"
	profileCollection syntax.NSID      = "app.bsky.actor.profile"
	profileRKey       syntax.RecordKey = "self"
)

// RevRecord is a record with the revision of the commit that wrote it.
type RevRecord struct {
	Record
	// Rev is the commit revision (a TID) that last wrote the record.
	Rev string
}

// Recent is what an account wrote after a given revision that an app
// view shows back to it: its posts, and its profile.
type Recent struct {
	// Profile is the account's current app.bsky.actor.profile/self
	// record, changed or not; nil when it has none.
	Profile *RevRecord
	// ProfileChanged reports whether Profile was written after the
	// revision.
	ProfileChanged bool
	// Posts are the app.bsky.feed.post records written after the
	// revision, oldest first: the newest ones, at most the limit asked for.
	Posts []RevRecord
}

// Rev returns did's current repository revision, "" when it has no
// repository here.
func (e *Engine) Rev(ctx context.Context, did syntax.DID) (string, error) {
	return rev(ctx, e.pool, did)
}

func rev(ctx context.Context, q db.DBTX, did syntax.DID) (string, error) {
	var r string
	err := db.Translate(q.QueryRow(ctx, qGetRev, did.String()).Scan(&r))
	switch {
	case errors.Is(err, db.ErrNotFound):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading repo rev: %w", err)
	}
	return r, nil
}

// RecordsSince returns did's posts (the newest limit of them) and profile
// written after since (a TID), for splicing into an app view's answers
// that do not show them yet. It returns nil when nothing was written after
// since, when did has no repository here, and when since is older than
// the repository's first commit here: the revision is then another
// server's (the account moved in, and its imported records carry this
// server's newer revisions), so none of them is news. A revision at or
// after the first commit is this repository's, even one from before its
// first record (a new account's genesis).
func (e *Engine) RecordsSince(ctx context.Context, did syntax.DID, since string, limit int) (*Recent, error) {
	return recordsSince(ctx, e.pool, did, since, limit)
}

func recordsSince(ctx context.Context, q db.DBTX, did syntax.DID, since string, limit int) (*Recent, error) {
	if _, err := syntax.ParseTID(since); err != nil {
		return nil, fmt.Errorf("repo: revision %q is not a TID", since)
	}
	var rawCID, data []byte
	var profileRev *string
	var known bool
	err := db.Translate(q.QueryRow(ctx, qProfileSince, did.String(), since).Scan(&rawCID, &profileRev, &data, &known))
	switch {
	case errors.Is(err, db.ErrNotFound), err == nil && !known:
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading profile: %w", err)
	}
	var out Recent
	if profileRev != nil {
		c, err := cid.Cast(rawCID)
		if err != nil {
			return nil, fmt.Errorf("%w: record cid: %v", ErrCorruptRepo, err)
		}
		out.Profile = &RevRecord{Record: Record{Collection: profileCollection, RKey: profileRKey, CID: c, Data: data}, Rev: *profileRev}
		out.ProfileChanged = *profileRev > since
	}
	if limit > 0 {
		posts, err := postsSince(ctx, q, did, since, limit)
		if err != nil {
			return nil, err
		}
		out.Posts = posts
	}
	if len(out.Posts) == 0 && !out.ProfileChanged {
		return nil, nil
	}
	return &out, nil
}

// postsSince reads did's newest posts written after since, returned
// oldest first.
func postsSince(ctx context.Context, q db.DBTX, did syntax.DID, since string, limit int) ([]RevRecord, error) {
	rows, err := q.Query(ctx, qPostsSince, did.String(), since, limit)
	if err != nil {
		return nil, fmt.Errorf("reading posts: %w", db.Translate(err))
	}
	var out []RevRecord
	var rkey, r string
	var raw, data []byte
	_, err = pgx.ForEachRow(rows, []any{&rkey, &raw, &r, &data}, func() error {
		c, err := cid.Cast(raw)
		if err != nil {
			return fmt.Errorf("%w: record cid: %v", ErrCorruptRepo, err)
		}
		out = append(out, RevRecord{
			Record: Record{Collection: postCollection, RKey: syntax.RecordKey(rkey), CID: c, Data: append([]byte(nil), data...)},
			Rev:    r,
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading posts: %w", db.Translate(err))
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
