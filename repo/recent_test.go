package repo

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

func TestRecordsSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 1)
	apply := func(writes ...Write) *CommitResult {
		t.Helper()
		res, err := b.engine.Apply(ctx, did, writes, nil)
		require.NoError(t, err)
		return res
	}
	text := func(r RevRecord) string {
		v, err := atdata.UnmarshalCBOR(r.Data)
		require.NoError(t, err)
		return v["text"].(string)
	}

	genesis, err := b.engine.Rev(ctx, did)
	require.NoError(t, err)
	require.NotEmpty(t, genesis)
	none, err := b.engine.Rev(ctx, "did:plc:nobodyhere0000000000000")
	require.NoError(t, err)
	require.Empty(t, none, "no repository: no revision")

	profile := map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Before"}
	first := apply(create("app.bsky.actor.profile", "self", profile), create("app.bsky.feed.post", "", post("first")))
	like := map[string]any{"$type": "app.bsky.feed.like", "subject": map[string]any{"uri": "at://" + did.String() + "/app.bsky.feed.post/x", "cid": first.Results[1].CID.String()}, "createdAt": "2026-11-29T00:00:00Z"}
	apply(create("app.bsky.feed.like", "", like))
	second := apply(create("app.bsky.feed.post", "", post("second")))

	got, err := b.engine.RecordsSince(ctx, did, first.Rev, 10)
	require.NoError(t, err)
	require.NotNil(t, got)
	require.Len(t, got.Posts, 1, "the like is not a post; the first post is not newer")
	require.Equal(t, "second", text(got.Posts[0]))
	require.Equal(t, second.Rev, got.Posts[0].Rev)
	require.Equal(t, second.Results[0].RKey, got.Posts[0].RKey)
	require.NotNil(t, got.Profile, "the current profile comes with the posts")
	require.False(t, got.ProfileChanged)
	require.Equal(t, first.Rev, got.Profile.Rev)

	rev, err := b.engine.Rev(ctx, did)
	require.NoError(t, err)
	require.Equal(t, second.Rev, rev)
	got, err = b.engine.RecordsSince(ctx, did, second.Rev, 10)
	require.NoError(t, err)
	require.Nil(t, got, "nothing newer")

	apply(create("app.bsky.feed.post", "", post("third")))
	apply(create("app.bsky.feed.post", "", post("fourth")))
	got, err = b.engine.RecordsSince(ctx, did, first.Rev, 2)
	require.NoError(t, err)
	require.Len(t, got.Posts, 2)
	require.Equal(t, "third", text(got.Posts[0]), "the newest two, oldest first")
	require.Equal(t, "fourth", text(got.Posts[1]))

	before := apply(create("app.bsky.feed.post", "", post("fifth")))
	profile["displayName"] = "After"
	apply(Write{Action: ActionUpdate, Collection: "app.bsky.actor.profile", RKey: "self", Record: profile})
	got, err = b.engine.RecordsSince(ctx, did, before.Rev, 10)
	require.NoError(t, err)
	require.Empty(t, got.Posts)
	require.True(t, got.ProfileChanged)
	v, err := atdata.UnmarshalCBOR(got.Profile.Data)
	require.NoError(t, err)
	require.Equal(t, "After", v["displayName"])

	// A revision older than the repository's first commit here is another
	// server's (an account that moved in): everything looks newer,
	// nothing is news.
	old := syntax.NewTIDFromTime(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), 0).String()
	got, err = b.engine.RecordsSince(ctx, did, old, 10)
	require.NoError(t, err)
	require.Nil(t, got)
	// The genesis revision is the repository's own, though it holds no
	// record: what came after is news.
	got, err = b.engine.RecordsSince(ctx, did, genesis, 10)
	require.NoError(t, err)
	require.NotNil(t, got)
	require.Len(t, got.Posts, 5)
	require.True(t, got.ProfileChanged)

	_, err = b.engine.RecordsSince(ctx, did, "not-a-tid", 10)
	require.Error(t, err)
	got, err = b.engine.RecordsSince(ctx, "did:plc:nobodyhere0000000000000", genesis, 10)
	require.NoError(t, err)
	require.Nil(t, got, "no repository here")
}

// A new account's first post and profile, when the app view has seen only
// its genesis commit, are news: the case every new account is in.
func TestRecordsSinceGenesis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 2)
	genesis, err := b.engine.Rev(ctx, did)
	require.NoError(t, err)
	_, err = b.engine.Apply(ctx, did, []Write{create("app.bsky.actor.profile", "self", map[string]any{"$type": "app.bsky.actor.profile", "displayName": "New"})}, nil)
	require.NoError(t, err)
	first, err := b.engine.Apply(ctx, did, []Write{create("app.bsky.feed.post", "", post("hello"))}, nil)
	require.NoError(t, err)

	got, err := b.engine.RecordsSince(ctx, did, genesis, 10)
	require.NoError(t, err)
	require.NotNil(t, got, "the genesis is the repository's own revision")
	require.Len(t, got.Posts, 1)
	require.Equal(t, first.Rev, got.Posts[0].Rev)
	require.True(t, got.ProfileChanged)
}

// The lookup of an account's posts since a revision walks the records
// index by (did, rev), not every post of the account, for a custom plan
// (the first executions of a prepared statement) and a generic one alike.
func TestPostsSinceUsesRevIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	did := b.newRepo(t, 3)
	// Many posts, each in a commit of its own, as an account builds them.
	_, err := b.pool.Exec(ctx, `INSERT INTO records (did, collection, rkey, cid, rev, data)
		SELECT $1, 'app.bsky.feed.post', lpad(i::text, 13, '0'), '\x01', lpad(i::text, 13, '0'), '\xa0'
		FROM generate_series(1, 20000) AS i`, did.String())
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "ANALYZE records")
	require.NoError(t, err)
	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	since := fmt.Sprintf("%013d", 19990)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err = conn.Exec(ctx, "SET plan_cache_mode = "+mode)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "PREPARE posts_since AS "+qPostsSince)
		require.NoError(t, err)
		var plan strings.Builder
		rows, err := conn.Query(ctx, fmt.Sprintf("EXPLAIN EXECUTE posts_since('%s', '%s', 25)", did, since))
		require.NoError(t, err)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			plan.WriteString(line + "\n")
		}
		require.NoError(t, rows.Err())
		require.Contains(t, plan.String(), "records_did_rev", mode)
		_, err = conn.Exec(ctx, "DEALLOCATE posts_since")
		require.NoError(t, err)
	}
}
