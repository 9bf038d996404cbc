package blob

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/repo"
)

// TestStoredTypeFallsBackToDeclared: where the sniffer recognises nothing
// the client's well-formed Content-Type is kept (as the reference PDS
// keeps it); where the bytes say what they are, they win.
func TestStoredTypeFallsBackToDeclared(t *testing.T) {
	t.Parallel()
	f := setup(t, backends[0], Config{})
	ctx := context.Background()
	did := f.newRepo(t, "quinn")
	quicktime := []byte("\x00\x00\x00\x14ftypqt  \x00\x00\x00\x00qt  moov")
	for _, tc := range []struct {
		data     []byte
		declared string
		want     string
	}{
		{quicktime, "video/quicktime", "video/quicktime"},
		{quicktime, "Video/QuickTime; codecs=x", "video/quicktime"},
		{quicktime, "", "application/octet-stream"},
		{quicktime, "no slash", "application/octet-stream"},
		{quicktime, "video/" + strings.Repeat("q", 200), "application/octet-stream"},
		{quicktime, "vi deo/quicktime", "application/octet-stream"},
		{[]byte(`{"json": true}`), "application/json", "application/json"},
		{pngBytes(t, 10), "text/plain", "image/png"},
		{[]byte("<!DOCTYPE html><script>alert(1)</script>"), "image/png", "text/html; charset=utf-8"},
	} {
		b, err := f.svc.Upload(ctx, did, bytes.NewReader(tc.data), tc.declared)
		require.NoError(t, err)
		require.Equal(t, tc.want, b.MimeType, "%q declared %q", tc.data, tc.declared)
	}
}

// TestReferenceMustMatchStoredBlob: a record's first reference to a blob
// must carry the type and size the blob is stored with (InvalidMimeType,
// InvalidSize, as the reference PDS answers), and a refused commit
// leaves the blob temporary.
func TestReferenceMustMatchStoredBlob(t *testing.T) {
	t.Parallel()
	f := setup(t, backends[0], Config{})
	ctx := context.Background()
	did := f.newRepo(t, "rita")
	blob, err := f.svc.Upload(ctx, did, bytes.NewReader(pngBytes(t, 1000)), "image/png")
	require.NoError(t, err)

	lie := *blob
	lie.MimeType = "text/html"
	require.ErrorIs(t, f.post(t, did, repo.ActionCreate, "p1", &lie), ErrInvalidMimeType)
	lie = *blob
	lie.Size++
	require.ErrorIs(t, f.post(t, did, repo.ActionCreate, "p1", &lie), ErrInvalidSize)
	var temp bool
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT temp_since IS NOT NULL FROM blobs WHERE did = $1 AND cid = $2", did.String(), blob.CID.String()).Scan(&temp))
	require.True(t, temp, "a refused commit makes nothing permanent")

	require.NoError(t, f.post(t, did, repo.ActionCreate, "p1", blob))
	require.Equal(t, blob.MimeType, "image/png")
}
