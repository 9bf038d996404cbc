package pds

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	carutil "github.com/ipld/go-car/util"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/repo/repotest"
)

const importOldRev = "3lb2aaaaaaaaa"

func importPosts(n int) map[string]map[string]any {
	out := map[string]map[string]any{}
	for i := range n {
		out[fmt.Sprintf("app.bsky.feed.post/3lb2aaaa%05d", i)] = post(fmt.Sprint("post ", i))
	}
	return out
}

// importState is what a refused import must leave alone.
func importState(t testing.TB, e *accountEnv) map[string]int {
	t.Helper()
	counts := e.rowCounts(t)
	var refs int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM record_blobs").Scan(&refs))
	counts["record_blobs"] = refs
	return counts
}

// TestImportRepoRefusals: malformed repositories, another account's,
// one with a record over the limits, and callers who may not import are
// each refused with a named 4xx, and nothing is stored.
func TestImportRepoRefusals(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{blobs: true})
	bob := e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	good := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(20))
	roots, blocks := repotest.SplitCAR(t, good)
	last := blocks[len(blocks)-1]
	tampered := append([]repotest.Block(nil), blocks...)
	data := bytes.Clone(last.Data)
	data[len(data)-1] ^= 1
	tampered[len(tampered)-1] = repotest.Block{CID: last.CID, Data: data}
	big := importPosts(1)
	huge := post(strings.Repeat("x", 540_000))
	huge["more"] = strings.Repeat("y", 540_000)
	big["app.bsky.feed.post/3huge"] = huge
	carOf := func(roots []cid.Cid, blocks ...repotest.Block) []byte {
		var buf bytes.Buffer
		require.NoError(t, repotest.WriteCAR(&buf, roots, blocks...))
		return buf.Bytes()
	}

	cases := []struct {
		name string
		car  []byte
		want string
	}{
		{"two roots", carOf([]cid.Cid{roots[0], last.CID}, blocks...), "the CAR has 2 roots"},
		{"bytes not matching the CID", carOf(roots, tampered...), "the bytes of block " + last.CID.String() + " do not match its CID"},
		{"truncated", good[:len(good)-5], "the CAR is truncated"},
		{"record over 1 MiB", repotest.RepoCAR(t, bob.did, oldKey, importOldRev, big), "app.bsky.feed.post/3huge (1,080,0"},
		{"another account's commit", repotest.RepoCAR(t, "did:plc:notbob", oldKey, importOldRev, importPosts(2)), "is for did:plc:notbob, not for this account"},
	}
	before := importState(t, e)
	for _, c := range cases {
		msg := e.do(t, http.MethodPost, "com.atproto.repo.importRepo", bob.access, bytes.NewReader(c.car), nil, carHeader).fails(t, http.StatusBadRequest, "InvalidRequest")
		require.Contains(t, msg, c.want, c.name)
		require.Equal(t, before, importState(t, e), c.name)
	}

	// Who may import: the account itself, with its password's session.
	e.do(t, http.MethodPost, "com.atproto.repo.importRepo", "", bytes.NewReader(good), nil, carHeader).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	ap := e.post(t, "com.atproto.server.createAppPassword", bob.access, map[string]any{"name": "phone"}).ok(t)
	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": bob.handle, "password": ap.str(t, "password")}).ok(t)
	before = importState(t, e)
	e.do(t, http.MethodPost, "com.atproto.repo.importRepo", s.str(t, "accessJwt"), bytes.NewReader(good), nil, carHeader).fails(t, http.StatusBadRequest, "InvalidToken")
	e.do(t, http.MethodPost, "com.atproto.repo.importRepo", bob.access, bytes.NewReader(good), nil, http.Header{"Content-Type": {"application/json"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Equal(t, before, importState(t, e))

	// The good one goes in.
	e.do(t, http.MethodPost, "com.atproto.repo.importRepo", bob.access, bytes.NewReader(good), nil, carHeader).ok(t)
	n, err := e.engine.CountRecords(context.Background(), bob.did)
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
}

// fillerBlocks is an endless stream of valid, distinct CAR blocks (up to
// max bytes), made as they are read: what a client sends after a CAR's
// real blocks to push the body past any limit.
type fillerBlocks struct {
	buf bytes.Buffer
	n   int
	max int64
	// sent is read by the test while the client's transport may still be
	// sending.
	sent atomic.Int64
}

func (f *fillerBlocks) Read(p []byte) (int, error) {
	for f.buf.Len() < len(p) && f.sent.Load()+int64(f.buf.Len()) < f.max {
		f.n++
		b, err := atdata.MarshalCBOR(map[string]any{"$type": "x.filler.block", "n": int64(f.n), "pad": strings.Repeat("p", 1000)})
		if err != nil {
			return 0, err
		}
		blk := repotest.CBORBlock(b)
		if err := carutil.LdWrite(&f.buf, blk.CID.Bytes(), blk.Data); err != nil {
			return 0, err
		}
	}
	if f.buf.Len() == 0 {
		return 0, io.EOF
	}
	n, _ := f.buf.Read(p)
	f.sent.Add(int64(n))
	return n, nil
}

// TestImportRepoSizeLimit: a body over --max-import-size is refused with
// 413 while it streams, long before its end, and nothing is stored; a
// declared length over it is refused before a byte is read.
func TestImportRepoSizeLimit(t *testing.T) {
	t.Parallel()
	const limit = 256 << 10
	e := newAccountEnv(t, envOptions{blobs: true, configure: func(c *config.Config) { c.MaxImportSize = limit }})
	bob := e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	good := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(20))
	before := importState(t, e)

	const total = 1 << 30
	filler := &fillerBlocks{max: total}
	req, err := http.NewRequest(http.MethodPost, e.url+"/xrpc/com.atproto.repo.importRepo", io.MultiReader(bytes.NewReader(good), filler))
	require.NoError(t, err)
	req.Header.Set("Content-Type", carContentType)
	req.Header.Set("Authorization", "Bearer "+bob.access)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	res := xrpcResult{status: resp.StatusCode, body: body}
	require.Contains(t, res.fails(t, http.StatusRequestEntityTooLarge, "PayloadTooLarge"), fmt.Sprint(limit))
	sent := filler.sent.Load()
	t.Logf("the client sent %d bytes of a %d-byte body before the refusal", sent, int64(total))
	require.Less(t, sent, int64(64<<20), "the server stopped reading near the limit")
	require.Equal(t, before, importState(t, e))

	huge := e.do(t, http.MethodPost, "com.atproto.repo.importRepo", bob.access, bytes.NewReader(make([]byte, limit+1)), nil, carHeader)
	huge.fails(t, http.StatusRequestEntityTooLarge, "PayloadTooLarge")
	require.Equal(t, before, importState(t, e))
}

// TestImportGate: imports beyond the concurrent bound are refused at once
// with 503, not queued; an account's second import is refused with 429
// and takes no slot; a finished import frees its slot.
func TestImportGate(t *testing.T) {
	t.Parallel()
	gate := newImportGate(2)
	alice, bob, carol := syntax.DID("did:plc:alice"), syntax.DID("did:plc:bob"), syntax.DID("did:plc:carol")
	leaveAlice, err := gate.enter(alice)
	require.NoError(t, err)
	_, err = gate.enter(alice)
	xe := xrpcErrorFor(err)
	require.Equal(t, http.StatusTooManyRequests, xe.Status)
	require.Equal(t, "RateLimitExceeded", xe.Name)
	require.NotEmpty(t, xe.Header.Get("Retry-After"))
	leaveBob, err := gate.enter(bob)
	require.NoError(t, err, "alice's refused second import took no slot")
	_, err = gate.enter(carol)
	xe = xrpcErrorFor(err)
	require.Equal(t, http.StatusServiceUnavailable, xe.Status)
	require.Equal(t, "ServiceOverloaded", xe.Name)
	require.NotEmpty(t, xe.Header.Get("Retry-After"))
	leaveAlice()
	require.False(t, gate.busy(alice))
	leave, err := gate.enter(carol)
	require.NoError(t, err, "a slot is free again")
	leave()
	leave, err = gate.enter(alice)
	require.NoError(t, err, "alice may import again")
	leave()
	leaveBob()
}

// TestAdminImportRepo: the admin variant needs admin credentials and an
// account with a repository, and records the import in the audit log.
func TestAdminImportRepo(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{blobs: true})
	bob := e.createUser(t)
	oldKey, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	car := repotest.RepoCAR(t, bob.did, oldKey, importOldRev, importPosts(3))
	adminImport := func(did, password string) xrpcResult {
		req, err := http.NewRequest(http.MethodPost, e.url+"/xrpc/"+AdminNSIDPrefix+"importRepo?did="+did+"&reason=restore", bytes.NewReader(car))
		require.NoError(t, err)
		req.Header.Set("Content-Type", carContentType)
		if password != "" {
			req.SetBasicAuth(AdminUser, password)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return xrpcResult{status: resp.StatusCode, body: body}
	}
	before := importState(t, e)
	adminImport(bob.did.String(), "").fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	adminImport(bob.did.String(), "wrong").fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	adminImport("did:plc:nobodyhere", testAdminPassword).fails(t, http.StatusBadRequest, "NotFound")
	require.Equal(t, before, importState(t, e))
	audits := auditCount(t, e.pool)

	res := adminImport(bob.did.String(), testAdminPassword).ok(t).json(t)
	require.EqualValues(t, 3, res["records"])
	require.Equal(t, bob.did.String(), res["did"])
	require.Equal(t, audits+1, auditCount(t, e.pool))
}
