package pds

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/repo"
)

// newFakeS3 starts an in-process S3 server (gofakes3) and returns a store
// on a bucket of it, through the real SDK client.
func newFakeS3(t testing.TB) blob.Store {
	t.Helper()
	mem := s3mem.New()
	require.NoError(t, mem.CreateBucket("bulwark"))
	ts := httptest.NewServer(gofakes3.New(mem).Server())
	t.Cleanup(ts.Close)
	s, err := blob.NewS3Store(context.Background(), blob.S3Config{
		Bucket: "bulwark", Endpoint: ts.URL, AccessKey: "test", SecretKey: "test-secret", SpoolDir: t.TempDir(),
	})
	require.NoError(t, err)
	return s
}

var blobBackends = []struct {
	name string
	s3   bool
}{{"disk", false}, {"s3", true}}

func (b *syncBundle) upload(t testing.TB, did syntax.DID, data []byte, contentType string) (*http.Response, []byte) {
	t.Helper()
	b.as(did)
	req, err := http.NewRequest(http.MethodPost, b.url+"/xrpc/com.atproto.repo.uploadBlob", bytes.NewReader(data))
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body
}

func (b *syncBundle) uploadOK(t testing.TB, did syntax.DID, data []byte, contentType string) atdata.Blob {
	t.Helper()
	resp, body := b.upload(t, did, data, contentType)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	var out struct {
		Blob atdata.Blob `json:"blob"`
	}
	require.NoError(t, json.Unmarshal(body, &out), "body: %s", body)
	require.Contains(t, string(body), `"$type":"blob"`)
	return out.Blob
}

// postBlobs writes a post referring to blobs.
func (b *syncBundle) postBlobs(t testing.TB, did syntax.DID, rkey string, blobs ...atdata.Blob) error {
	t.Helper()
	_, err := b.engine.Apply(context.Background(), did, []repo.Write{{
		Action: repo.ActionCreate, Collection: "app.bsky.feed.post", RKey: syntax.RecordKey(rkey), Record: postRecord("look", blobs...),
	}}, nil)
	return err
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	out := make([]byte, n)
	_, err := rand.Read(out)
	require.NoError(t, err)
	return out
}

func pngData(t testing.TB, n int) []byte {
	return append([]byte("\x89PNG\r\n\x1a\n"), randomBytes(t, n)...)
}

func TestUploadThenGetBlob(t *testing.T) {
	t.Parallel()
	for _, be := range blobBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			b := syncSetup(t, syncOptions{s3: be.s3})
			did := b.newAccount(t, "alice", account.StatusActive)
			data := pngData(t, 300_000)
			ref := b.uploadOK(t, did, data, "image/png")
			require.Equal(t, blob.ComputeCID(data).String(), ref.Ref.String())
			require.Equal(t, "image/png", ref.MimeType)
			require.Equal(t, int64(len(data)), ref.Size)

			q := url.Values{"did": {did.String()}, "cid": {ref.Ref.String()}}
			resp, body := b.get(t, "com.atproto.sync.getBlob", q)
			requireXRPC(t, resp, body, http.StatusBadRequest, "BlobNotFound") // not posted yet

			require.NoError(t, b.postBlobs(t, did, "p1", ref))
			resp, body = b.get(t, "com.atproto.sync.getBlob", q)
			require.Equal(t, http.StatusOK, resp.StatusCode, "body: %.200s", body)
			require.True(t, bytes.Equal(data, body), "getBlob returns the uploaded bytes")
			h := resp.Header
			require.Equal(t, "image/png", h.Get("Content-Type"))
			require.Equal(t, fmt.Sprint(len(data)), h.Get("Content-Length"))
			require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
			require.Equal(t, "default-src 'none'; sandbox", h.Get("Content-Security-Policy"))
			require.Equal(t, `"`+ref.Ref.String()+`"`, h.Get("ETag"))

			// HEAD: the same headers, no body.
			req, err := http.NewRequest(http.MethodHead, b.url+"/xrpc/com.atproto.sync.getBlob?"+q.Encode(), nil)
			require.NoError(t, err)
			hr, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			hb, _ := io.ReadAll(hr.Body)
			hr.Body.Close()
			require.Equal(t, http.StatusOK, hr.StatusCode)
			require.Empty(t, hb)
			for _, k := range []string{"Content-Type", "Content-Length", "X-Content-Type-Options", "Content-Security-Policy", "ETag"} {
				require.Equal(t, h.Get(k), hr.Header.Get(k), k)
			}

			// A range.
			req, err = http.NewRequest(http.MethodGet, b.url+"/xrpc/com.atproto.sync.getBlob?"+q.Encode(), nil)
			require.NoError(t, err)
			req.Header.Set("Range", "bytes=1000-1999")
			rr, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			part, err := io.ReadAll(rr.Body)
			rr.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusPartialContent, rr.StatusCode)
			require.Equal(t, data[1000:2000], part)
			require.Equal(t, fmt.Sprintf("bytes 1000-1999/%d", len(data)), rr.Header.Get("Content-Range"))

			// A cached copy is still good.
			req.Header.Del("Range")
			req.Header.Set("If-None-Match", h.Get("ETag"))
			nr, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			nr.Body.Close()
			require.Equal(t, http.StatusNotModified, nr.StatusCode)

			// listBlobs names it.
			resp, body = b.get(t, "com.atproto.sync.listBlobs", url.Values{"did": {did.String()}})
			require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
			require.JSONEq(t, fmt.Sprintf(`{"cids":[%q]}`, ref.Ref.String()), string(body))
		})
	}
}

func TestUploadOverSizeKeepsNothing(t *testing.T) {
	t.Parallel()
	for _, be := range blobBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := syncSetup(t, syncOptions{s3: be.s3, configure: func(c *config.Config) { c.BlobMaxBytes = 50_000 }})
			did := b.newAccount(t, "alice", account.StatusActive)
			data := pngData(t, 60_000)

			// Declared length over the limit: refused before a byte is read.
			resp, body := b.upload(t, did, data, "image/png")
			requireXRPC(t, resp, body, http.StatusRequestEntityTooLarge, "PayloadTooLarge")

			// Unknown length (chunked): refused once the limit is passed.
			b.as(did)
			req, err := http.NewRequest(http.MethodPost, b.url+"/xrpc/com.atproto.repo.uploadBlob", io.MultiReader(bytes.NewReader(data)))
			require.NoError(t, err)
			req.ContentLength = -1
			cr, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			cb, _ := io.ReadAll(cr.Body)
			cr.Body.Close()
			requireXRPC(t, cr, cb, http.StatusRequestEntityTooLarge, "PayloadTooLarge")

			var n int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM blobs").Scan(&n))
			require.Zero(t, n)
			_, err = b.store.Stat(ctx, blob.ComputeCID(data).String())
			require.ErrorIs(t, err, blob.ErrObjectNotFound)

			// At the limit: accepted.
			b.uploadOK(t, did, data[:50_000], "")
		})
	}
}

func TestUploadMIMEIsSniffed(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "mallory", account.StatusActive)

	// HTML that claims to be an image is stored, and served, as HTML, with
	// nosniff and a sandbox CSP so that it cannot run in this origin.
	html := []byte("<!DOCTYPE html><html><script>steal()</script></html>")
	ref := b.uploadOK(t, did, html, "image/png")
	require.Equal(t, "text/html; charset=utf-8", ref.MimeType)
	require.NoError(t, b.postBlobs(t, did, "p", ref))
	resp, body := b.get(t, "com.atproto.sync.getBlob", url.Values{"did": {did.String()}, "cid": {ref.Ref.String()}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, html, body)
	require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	require.Equal(t, "default-src 'none'; sandbox", resp.Header.Get("Content-Security-Policy"))

	// A real image labelled as something else is an image.
	img := b.uploadOK(t, did, pngData(t, 100), "text/html")
	require.Equal(t, "image/png", img.MimeType)
}

func TestConcurrentUploadsSameBytesTwoAccounts(t *testing.T) {
	t.Parallel()
	for _, be := range blobBackends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			b := syncSetup(t, syncOptions{s3: be.s3})
			alice := b.newAccount(t, "alice", account.StatusActive)
			bob := b.newAccount(t, "bob", account.StatusActive)
			data := pngData(t, 500_000)
			// The auth hook serves one caller at a time, so the two
			// accounts' uploads go through the service concurrently.
			var wg sync.WaitGroup
			refs := make([]*blob.Blob, 6)
			errs := make([]error, 6)
			for i := range refs {
				did := alice
				if i%2 == 1 {
					did = bob
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					refs[i], errs[i] = b.blobs.Upload(context.Background(), did, bytes.NewReader(data), "")
				}()
			}
			wg.Wait()
			for i := range refs {
				require.NoError(t, errs[i])
				require.Equal(t, refs[0].CID, refs[i].CID)
			}
			require.NoError(t, b.postBlobs(t, alice, "a", refs[0].Ref()))
			require.NoError(t, b.postBlobs(t, bob, "b", refs[1].Ref()))
			for _, did := range []syntax.DID{alice, bob} {
				resp, body := b.get(t, "com.atproto.sync.getBlob", url.Values{"did": {did.String()}, "cid": {refs[0].CID.String()}})
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.True(t, bytes.Equal(data, body))
			}
		})
	}
}

func TestListBlobsPaginatedAndSince(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "alice", account.StatusActive)
	var all []string
	for i := range 5 {
		ref := b.uploadOK(t, did, pngData(t, 100+i), "")
		require.NoError(t, b.postBlobs(t, did, fmt.Sprintf("p%d", i), ref))
		all = append(all, ref.Ref.String())
	}
	var got []string
	cursor := ""
	for {
		q := url.Values{"did": {did.String()}, "limit": {"2"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		resp, body := b.get(t, "com.atproto.sync.listBlobs", q)
		require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
		var page struct {
			Cursor *string  `json:"cursor"`
			Cids   []string `json:"cids"`
		}
		require.NoError(t, json.Unmarshal(body, &page))
		got = append(got, page.Cids...)
		if page.Cursor == nil {
			break
		}
		cursor = *page.Cursor
	}
	require.ElementsMatch(t, all, got)

	// since: only blobs of records written after that rev.
	var rev string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT max(rev) FROM record_blobs WHERE did = $1", did.String()).Scan(&rev))
	ref := b.uploadOK(t, did, pngData(t, 999), "")
	require.NoError(t, b.postBlobs(t, did, "late", ref))
	resp, body := b.get(t, "com.atproto.sync.listBlobs", url.Values{"did": {did.String()}, "since": {rev}})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.JSONEq(t, fmt.Sprintf(`{"cids":[%q]}`, ref.Ref.String()), string(body))
}

func TestListMissingBlobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "alice", account.StatusActive)
	ghost := blob.ComputeCID([]byte("imported, never uploaded")).String()
	_, err := b.pool.Exec(ctx, "INSERT INTO record_blobs (did, record_path, blob_cid, rev) VALUES ($1, 'app.bsky.feed.post/x', $2, 'r')", did.String(), ghost)
	require.NoError(t, err)
	b.as(did)
	resp, body := b.get(t, "com.atproto.repo.listMissingBlobs", url.Values{})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.JSONEq(t, fmt.Sprintf(`{"blobs":[{"cid":%q,"recordUri":"at://%s/app.bsky.feed.post/x"}]}`, ghost, did), string(body))

	b.uploadOK(t, did, []byte("imported, never uploaded"), "")
	resp, body = b.get(t, "com.atproto.repo.listMissingBlobs", url.Values{})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.JSONEq(t, `{"blobs":[]}`, string(body))
}

func TestRecordWithUnknownBlobRefused(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "alice", account.StatusActive)
	ghost := atdata.Blob{Ref: atdata.CIDLink(blob.ComputeCID([]byte("never uploaded"))), MimeType: "image/png", Size: 14}
	err := b.postBlobs(t, did, "p", ghost)
	require.ErrorIs(t, err, blob.ErrBlobNotFound)
	xe := xrpcErrorFor(err)
	require.Equal(t, http.StatusBadRequest, xe.Status)
	require.Equal(t, "BlobNotFound", xe.Name)
	require.Contains(t, xe.Message, ghost.Ref.String())
}

func TestUploadWithSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := syncSetup(t, syncOptions{realAuth: true})
	did := b.newAccount(t, "alice", account.StatusActive)
	post := func(token string) (*http.Response, []byte) {
		req, err := http.NewRequest(http.MethodPost, b.url+"/xrpc/com.atproto.repo.uploadBlob", strings.NewReader("hello"))
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, body
	}
	resp, body := post("")
	requireXRPC(t, resp, body, http.StatusUnauthorized, "AuthenticationRequired")

	sess, err := b.accounts.CreateSession(ctx, did, nil)
	require.NoError(t, err)
	resp, body = post(sess.AccessJwt)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	require.Contains(t, string(body), blob.ComputeCID([]byte("hello")).String())

	// Deactivated accounts may still upload (migration uploads blobs
	// before activation); taken-down ones may not.
	b.setStatus(t, did, account.StatusDeactivated)
	resp, body = post(sess.AccessJwt)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", body)
	b.setStatus(t, did, account.StatusTakendown)
	resp, body = post(sess.AccessJwt)
	require.GreaterOrEqual(t, resp.StatusCode, 400, "body: %s", body)
	require.Less(t, resp.StatusCode, 500, "body: %s", body)
}
