package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atdata"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"
)

// The account a full move carries: moveRecords records in four
// collections, moveBlobs blobs that records refer to (two images in
// posts, the profile's avatar), and preferences.
const (
	moveRecords = 300
	moveBlobs   = 3
	movePosts   = 150
	moveFollows = 100
	moveLikes   = moveRecords - movePosts - moveFollows - 1 // and one profile
)

// movePrefs are the preferences the moved account holds; the server adds
// the derived declaredAgePref.
var movePrefs = []any{
	map[string]any{"$type": "app.bsky.actor.defs#adultContentPref", "enabled": true},
	map[string]any{"$type": "app.bsky.actor.defs#contentLabelPref", "label": "nsfw", "visibility": "warn"},
	map[string]any{"$type": "app.bsky.actor.defs#personalDetailsPref", "birthDate": "1990-05-01T00:00:00.000Z"},
	map[string]any{"$type": "app.bsky.actor.defs#threadViewPref", "sort": "oldest"},
}

// writeMoveAccount fills u's account on e with the records, blobs and
// preferences a move must carry, and returns the blobs' bytes by CID.
func writeMoveAccount(t *testing.T, e *accountEnv, u *user) map[string][]byte {
	t.Helper()
	blobs := map[string][]byte{}
	refs := make([]atdata.Blob, moveBlobs)
	for i := range refs {
		data := pngData(t, 4000+1000*i)
		res := e.do(t, http.MethodPost, "com.atproto.repo.uploadBlob", u.access, bytes.NewReader(data), nil, http.Header{"Content-Type": {"image/png"}}).ok(t)
		var out uploadBlobOutput
		require.NoError(t, json.Unmarshal(res.body, &out))
		refs[i] = out.Blob
		blobs[out.Blob.Ref.String()] = data
	}
	create := func(collection string, value map[string]any) map[string]any {
		return map[string]any{"$type": applyWritesNS + "create", "collection": collection, "value": value}
	}
	posts := make([]any, movePosts)
	for i := range posts {
		var imgs []atdata.Blob
		if i < 2 {
			imgs = refs[1+i : 2+i]
		}
		posts[i] = create("app.bsky.feed.post", postRecord(fmt.Sprint("post ", i), imgs...))
	}
	res := e.post(t, "com.atproto.repo.applyWrites", u.access, map[string]any{"repo": u.did, "writes": posts}).ok(t).json(t)
	made := res["results"].([]any)

	var rest []any
	for i := range moveFollows {
		rest = append(rest, create("app.bsky.graph.follow", map[string]any{
			"$type": "app.bsky.graph.follow", "subject": fmt.Sprintf("did:plc:followed%016d", i), "createdAt": "2026-11-29T00:00:00Z",
		}))
	}
	for i := range moveLikes {
		p := made[i].(map[string]any)
		rest = append(rest, create("app.bsky.feed.like", map[string]any{
			"$type": "app.bsky.feed.like", "subject": map[string]any{"uri": p["uri"], "cid": p["cid"]}, "createdAt": "2026-11-29T00:00:00Z",
		}))
	}
	e.post(t, "com.atproto.repo.applyWrites", u.access, map[string]any{"repo": u.did, "writes": rest}).ok(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.actor.profile", "rkey": "self",
		"record": map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Moving", "avatar": refs[0]}}).ok(t)
	e.post(t, nsidPutPrefs, u.access, map[string]any{"preferences": movePrefs}).ok(t)
	return blobs
}

// accountCopy is what an account holds, as its server serves it: what a
// move must carry over unchanged.
type accountCopy struct {
	// records are listRecords' answers (uri, cid, value) by collection.
	records map[string][]any
	// blobs are the account's blobs' bytes by CID (listBlobs, getBlob).
	blobs map[string][]byte
	// prefs is getPreferences' answer.
	prefs []any
	// data is the MST root of the current commit (sync.getRepo).
	data cid.Cid
	// count is how many records there are.
	count int
}

// copyOf reads u's account on e, as its owner (a deactivated account
// serves its repository and blobs to its owner only).
func copyOf(t *testing.T, e *accountEnv, u *user) *accountCopy {
	t.Helper()
	did := u.did.String()
	c := &accountCopy{records: map[string][]any{}, blobs: map[string][]byte{}}
	desc := e.get(t, "com.atproto.repo.describeRepo", "", url.Values{"repo": {did}}).ok(t).json(t)
	for _, col := range desc["collections"].([]any) {
		cursor := ""
		for {
			q := url.Values{"repo": {did}, "collection": {col.(string)}, "limit": {"100"}}
			if cursor != "" {
				q.Set("cursor", cursor)
			}
			page := e.get(t, "com.atproto.repo.listRecords", "", q).ok(t).json(t)
			recs, _ := page["records"].([]any)
			c.records[col.(string)] = append(c.records[col.(string)], recs...)
			c.count += len(recs)
			if cursor, _ = page["cursor"].(string); cursor == "" || len(recs) == 0 {
				break
			}
		}
	}
	blobs := e.get(t, "com.atproto.sync.listBlobs", u.access, url.Values{"did": {did}, "limit": {"1000"}}).ok(t).json(t)
	for _, b := range blobs["cids"].([]any) {
		q := url.Values{"did": {did}, "cid": {b.(string)}}
		c.blobs[b.(string)] = e.get(t, "com.atproto.sync.getBlob", u.access, q).ok(t).body
	}
	prefs := e.get(t, "app.bsky.actor.getPreferences", u.access, nil).ok(t).json(t)
	c.prefs = prefs["preferences"].([]any)
	car := e.get(t, "com.atproto.sync.getRepo", u.access, url.Values{"did": {did}}).ok(t).body
	commit, _, err := atrepo.LoadRepoFromCAR(context.Background(), bytes.NewReader(car))
	require.NoError(t, err)
	c.data = commit.Data
	return c
}

// requireRepoVerifies loads did's repository from e's sync.getRepo with
// indigo: the commit is did's, signed with the key did's DID document
// names, and its MST root is what the records' keys and CIDs hash to,
// each record's block matching its CID. It returns the commit.
func requireRepoVerifies(t *testing.T, p *movePair, e *accountEnv, did syntax.DID) *atrepo.Commit {
	t.Helper()
	ctx := context.Background()
	car := e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {did.String()}}).ok(t).body
	commit, r, err := atrepo.LoadRepoFromCAR(ctx, bytes.NewReader(car))
	require.NoError(t, err)
	require.Equal(t, did.String(), commit.DID)
	ident, err := p.dir.LookupDID(ctx, did)
	require.NoError(t, err)
	pub, err := ident.PublicKey()
	require.NoError(t, err)
	require.NoError(t, commit.VerifySignature(pub))

	leaves := map[string]cid.Cid{}
	require.NoError(t, r.MST.Walk(func(key []byte, val cid.Cid) error {
		leaves[string(key)] = val
		blk, err := r.RecordStore.Get(ctx, val)
		if err != nil {
			return fmt.Errorf("record %s: %w", key, err)
		}
		if sum, err := val.Prefix().Sum(blk.RawData()); err != nil || !sum.Equals(val) {
			return fmt.Errorf("record %s: its block does not hash to %s", key, val)
		}
		return nil
	}))
	rebuilt, err := mst.LoadTreeFromMap(leaves)
	require.NoError(t, err)
	root, err := rebuilt.RootCID()
	require.NoError(t, err)
	require.Equal(t, commit.Data.String(), root.String(), "MST root")
	return commit
}
