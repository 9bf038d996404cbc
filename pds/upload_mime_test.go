package pds

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/stretchr/testify/require"
)

// uploadResult is upload with the whole answer.
func (e *oauthEnv) uploadResult(sess *indigo.ClientSession, mime string, data []byte) xrpcResult {
	t := e.t
	req, err := http.NewRequest(http.MethodPost, e.publicURL()+"/xrpc/"+uploadBlobNSID, strings.NewReader(string(data)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", mime)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(string(data))), nil }
	resp, err := sess.DoWithAuth(http.DefaultClient, req, uploadBlobNSID)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return xrpcResult{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestOAuthBlobPermissionIsForStoredType: an OAuth grant's blob:
// permission is checked against the type the blob is stored (and served)
// as, sniffed from its bytes, not the type the app declared. Bytes that
// are not what the grant allows are refused whatever their label, and
// leave nothing behind: no row, no scratch file, no object.
func TestOAuthBlobPermissionIsForStoredType(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	sess := e.session(e.app("images", "atproto", "blob:image/*"), u)

	before := e.blobRows(t)
	for _, c := range []struct {
		name   string
		data   []byte
		stored string
	}{
		{"HTML", []byte("<!DOCTYPE html><html><script>steal()</script></html>"), "text/html"},
		{"XML SVG", []byte(`<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"><script>steal()</script></svg>`), "text/xml"},
		{"video", mp4Data(t, 1000), "video/mp4"},
	} {
		res := e.uploadResult(sess, "image/png", c.data)
		msg := res.fails(t, http.StatusForbidden, "InsufficientScope")
		require.Contains(t, msg, "blob:"+c.stored, c.name)
	}
	require.Equal(t, before, e.blobRows(t), "a refused upload records nothing")
	requireNoBlobFiles(t, e.cfg.BlobDir)

	// What the grant allows is stored, whatever label it came with.
	res := e.uploadResult(sess, "text/plain", pngData(t, 100)).ok(t)
	require.Contains(t, string(res.body), `"mimeType":"image/png"`)
	require.Equal(t, before+1, e.blobRows(t))

	// Bytes the sniffer recognises as nothing but text keep the declared
	// type, as the reference PDS keeps it: an SVG without an XML
	// declaration labelled image/png is stored (and served, with nosniff)
	// as image/png, which no browser renders as SVG.
	svg := []byte(`<svg xmlns="http://www.w3.org/2000/svg"><script>steal()</script></svg>`)
	res = e.uploadResult(sess, "image/png", svg).ok(t)
	require.Contains(t, string(res.body), `"mimeType":"image/png"`)
}

// requireNoBlobFiles requires the blob directory to hold no object and no
// upload in progress.
func requireNoBlobFiles(t *testing.T, dir string) {
	t.Helper()
	var files []string
	require.NoError(t, filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return err
	}))
	require.Empty(t, files)
}
