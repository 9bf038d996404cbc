package blob

import (
	"bytes"
	"context"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/repo"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

// TestImportReferences imports a repository over one whose record uses an
// uploaded blob: the new records' references replace the old ones, a
// referenced blob never uploaded is missing until its upload (which makes
// it permanent at once), an uploaded one it names becomes permanent, and
// the one only the old records used starts its expiry.
func TestImportReferences(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, backends[0], Config{})
	did := f.newRepo(t, "mover")
	old, err := f.svc.Upload(ctx, did, bytes.NewReader([]byte("old picture")), "")
	require.NoError(t, err)
	require.NoError(t, f.post(t, did, repo.ActionCreate, "before", old))
	kept, err := f.svc.Upload(ctx, did, bytes.NewReader([]byte("uploaded before the import")), "")
	require.NoError(t, err)
	ghost := ComputeCID([]byte("arrives after the import"))
	ghostRef := atdata.Blob{Ref: atdata.CIDLink(ghost), MimeType: "image/png", Size: 24}

	post := func(blobs ...atdata.Blob) map[string]any {
		var images []any
		for _, b := range blobs {
			images = append(images, map[string]any{"alt": "", "image": b})
		}
		return map[string]any{"$type": "app.bsky.feed.post", "text": "moved", "createdAt": "2026-11-29T00:00:00Z",
			"embed": map[string]any{"$type": "app.bsky.embed.images", "images": images}}
	}
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	car := repotest.RepoCAR(t, did, oldKey, "3lb2aaaaaaaaa", map[string]map[string]any{
		"app.bsky.feed.post/one": post(ghostRef, kept.Ref(), ghostRef),
		"app.bsky.feed.post/two": post(ghostRef),
	})
	res, err := f.engine.Import(ctx, did, bytes.NewReader(car), repo.ImportOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 3, res.BlobRefs, "one reference per record and blob")

	missing, _, err := f.svc.ListMissing(ctx, did, "", 10)
	require.NoError(t, err)
	require.Equal(t, []MissingBlob{{CID: ghost.String(), RecordPath: "app.bsky.feed.post/one"}}, missing)
	require.True(t, f.permanent(t, did, kept.CID.String()), "an uploaded blob the import names is kept")
	require.False(t, f.permanent(t, did, old.CID.String()), "the replaced record's blob starts expiring")

	_, err = f.svc.Upload(ctx, did, bytes.NewReader([]byte("arrives after the import")), "")
	require.NoError(t, err)
	missing, _, err = f.svc.ListMissing(ctx, did, "", 10)
	require.NoError(t, err)
	require.Empty(t, missing)
	require.True(t, f.permanent(t, did, ghost.String()), "the upload attaches to the imported records")
	all, _, err := f.svc.ListBlobs(ctx, did, "", "", 10)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{ghost.String(), kept.CID.String()}, all)
}

// permanent reports whether did's blob c is kept (no expiry running).
func (f *fixture) permanent(t *testing.T, did syntax.DID, c string) bool {
	t.Helper()
	var temp bool
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT temp_since IS NOT NULL FROM blobs WHERE did = $1 AND cid = $2", did.String(), c).Scan(&temp))
	return !temp
}
