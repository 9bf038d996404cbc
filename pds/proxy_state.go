package pds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/proxy"
	"github.com/bulwark-pds/bulwark/repo"
)

// localState is proxy.LocalState over the repository engine and the
// accounts: what read-after-write splices into an app view's answers
// while the app view has not seen the caller's latest writes.
type localState struct {
	repo     *repo.Engine
	accounts *account.Service
}

var _ proxy.LocalState = localState{}

// RepoRev implements proxy.LocalState.
func (l localState) RepoRev(ctx context.Context, did syntax.DID) (string, error) {
	return l.repo.Rev(ctx, did)
}

// RecordsSince implements proxy.LocalState: the caller's newest posts and
// its profile written after rev, as atproto JSON, with its handle.
func (l localState) RecordsSince(ctx context.Context, did syntax.DID, rev string) (*proxy.LocalRecords, error) {
	recent, err := l.repo.RecordsSince(ctx, did, rev, proxy.MaxLocalPosts)
	if err != nil || recent == nil {
		return nil, err
	}
	out := &proxy.LocalRecords{ProfileChanged: recent.ProfileChanged}
	a, err := l.accounts.Get(ctx, did)
	switch {
	case err == nil:
		out.Handle = a.Handle.String()
	case !errors.Is(err, account.ErrAccountNotFound):
		return nil, err
	}
	if recent.Profile != nil {
		rec, err := localRecord(did, *recent.Profile)
		if err != nil {
			return nil, err
		}
		out.Profile = &rec
	}
	for _, p := range recent.Posts {
		rec, err := localRecord(did, p)
		if err != nil {
			return nil, err
		}
		out.Posts = append(out.Posts, rec)
	}
	return out, nil
}

// localRecord renders a stored record as the proxy wants it. When it was
// stored is the time in its revision: a commit's rev is the TID of the
// moment it was made.
func localRecord(did syntax.DID, r repo.RevRecord) (proxy.Record, error) {
	rendered, err := recordJSON(did, &r.Record)
	if err != nil {
		return proxy.Record{}, fmt.Errorf("rendering %s: %w", atURI(did, r.Collection, r.RKey), err)
	}
	value, err := json.Marshal(rendered.Value)
	if err != nil {
		return proxy.Record{}, fmt.Errorf("rendering %s: %w", rendered.URI, err)
	}
	tid, err := syntax.ParseTID(r.Rev)
	if err != nil {
		return proxy.Record{}, fmt.Errorf("record %s has revision %q: %w", rendered.URI, r.Rev, err)
	}
	return proxy.Record{
		URI:       syntax.ATURI(rendered.URI),
		CID:       syntax.CID(rendered.CID),
		IndexedAt: tid.Time(),
		Value:     value,
	}, nil
}
