package plc_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

func newKey(t *testing.T) *atcrypto.PrivateKeyK256 {
	t.Helper()
	k, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	return k
}

func TestGenesisUpdateTombstone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, srv := plctest.NewServer(t)
	rot := newKey(t)
	c, err := plc.NewClient(srv.URL, rot, nil)
	require.NoError(t, err)
	signing := newKey(t)
	pub, err := signing.PublicKey()
	require.NoError(t, err)

	did, op, err := c.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://localhost:2583"})
	require.NoError(t, err)
	require.NoError(t, c.Submit(ctx, did, op))

	doc, err := c.Resolve(ctx, did)
	require.NoError(t, err)
	require.Equal(t, did.String(), doc.ID)
	require.Equal(t, []string{"at://alice.test"}, doc.AlsoKnownAs)
	require.Equal(t, "http://localhost:2583", doc.Service[0].ServiceEndpoint)
	require.Equal(t, pub.Multibase(), doc.VerificationMethod[0].PublicKeyMultibase)

	require.NoError(t, c.UpdateHandle(ctx, did, "bob.test"))
	doc, err = c.Resolve(ctx, did)
	require.NoError(t, err)
	require.Equal(t, []string{"at://bob.test"}, doc.AlsoKnownAs)
	require.NoError(t, didplc.VerifyOpLog(dir.Log(did.String())))

	// Replaying the genesis is refused; so is an op signed by another key.
	require.ErrorIs(t, c.Submit(ctx, did, op), plc.ErrDirectory)
	other, err := plc.NewClient(srv.URL, newKey(t), nil)
	require.NoError(t, err)
	require.ErrorIs(t, other.UpdateHandle(ctx, did, "mallory.test"), plc.ErrNotControlled)

	// A genesis submitted under the wrong DID is refused.
	did2, op2, err := c.Genesis(plc.Identity{Handle: "carol.test", SigningKey: pub, PDSEndpoint: "http://x"})
	require.NoError(t, err)
	require.ErrorIs(t, c.Submit(ctx, syntax.DID("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"), op2), plc.ErrDirectory)
	require.NoError(t, c.Submit(ctx, did2, op2))

	// A genesis signed by a key that is not among its rotation keys is refused.
	forged := *op2
	forged.AlsoKnownAs = []string{"at://forged.test"}
	require.NoError(t, forged.Sign(newKey(t)))
	fdid, err := forged.DID()
	require.NoError(t, err)
	require.ErrorIs(t, c.Submit(ctx, syntax.DID(fdid), &forged), plc.ErrDirectory)

	require.NoError(t, c.Tombstone(ctx, did2, op2))
	_, err = c.Resolve(ctx, did2)
	require.ErrorIs(t, err, plc.ErrDirectory)
}

func TestDirectoryPersists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "plc.jsonl")
	dir, err := plctest.Open(path)
	require.NoError(t, err)
	srv := httptest.NewServer(dir)
	c, err := plc.NewClient(srv.URL, newKey(t), nil)
	require.NoError(t, err)
	pub, err := newKey(t).PublicKey()
	require.NoError(t, err)
	did, op, err := c.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://x"})
	require.NoError(t, err)
	require.NoError(t, c.Submit(ctx, did, op))
	require.NoError(t, c.UpdateHandle(ctx, did, "bob.test"))
	srv.Close()
	require.NoError(t, dir.Close())

	dir, err = plctest.Open(path)
	require.NoError(t, err)
	defer dir.Close()
	require.Len(t, dir.Log(did.String()), 2)
	require.NoError(t, didplc.VerifyOpLog(dir.Log(did.String())))
}

func TestDirectoryEndpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, srv := plctest.NewServer(t)
	c, err := plc.NewClient(srv.URL, newKey(t), nil)
	require.NoError(t, err)
	pub, err := newKey(t).PublicKey()
	require.NoError(t, err)
	did, op, err := c.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://x"})
	require.NoError(t, err)
	require.NoError(t, c.Submit(ctx, did, op))
	require.NoError(t, c.UpdateHandle(ctx, did, "bob.test"))

	get := func(path string) (int, map[string]any, []any) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var m map[string]any
		var a []any
		if json.Unmarshal(b, &m) != nil {
			require.NoError(t, json.Unmarshal(b, &a), "%s", b)
		}
		return resp.StatusCode, m, a
	}
	status, data, _ := get("/" + did.String() + "/data")
	require.Equal(t, 200, status)
	require.Equal(t, []any{"at://bob.test"}, data["alsoKnownAs"])
	require.Equal(t, []any{c.RotationKey()}, data["rotationKeys"])
	status, _, log := get("/" + did.String() + "/log")
	require.Equal(t, 200, status)
	require.Len(t, log, 2)
	status, last, _ := get("/" + did.String() + "/log/last")
	require.Equal(t, 200, status)
	require.Equal(t, "plc_operation", last["type"])
	require.NotNil(t, last["prev"])
	status, _, audit := get("/" + did.String() + "/log/audit")
	require.Equal(t, 200, status)
	require.Len(t, audit, 2)
	require.Equal(t, did.String(), audit[0].(map[string]any)["did"])
	status, doc, _ := get("/" + did.String())
	require.Equal(t, 200, status)
	require.Contains(t, doc["@context"], "https://www.w3.org/ns/did/v1")
	status, _, _ = get("/did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
	require.Equal(t, 404, status)

	// Malformed submissions are 400s, not crashes.
	for _, body := range []string{`not json`, `{"type":"nope"}`, `{}`} {
		resp, err := http.Post(srv.URL+"/"+did.String(), "application/json", strings.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, body)
	}
}

// refuseAll is a transport that records and fails every request.
type refuseAll struct{ calls atomic.Int32 }

func (r *refuseAll) RoundTrip(*http.Request) (*http.Response, error) {
	r.calls.Add(1)
	return nil, errors.New("no request may leave this test")
}

// TestInsecureEndpointNeverReachesPublicDirectory: an http:// PDS endpoint
// is refused for a public directory before anything is signed or sent,
// whichever way the operation comes; local directories take it.
func TestInsecureEndpointNeverReachesPublicDirectory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rt := &refuseAll{}
	rot := newKey(t)
	public, err := plc.NewClient("https://plc.directory", rot, &http.Client{Transport: rt})
	require.NoError(t, err)
	pub, err := newKey(t).PublicKey()
	require.NoError(t, err)

	_, _, err = public.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://localhost:2583"})
	require.ErrorIs(t, err, plc.ErrInsecureEndpoint)
	require.ErrorIs(t, err, plc.ErrDirectory)

	// An operation signed for a local directory cannot be sent to the
	// public one either.
	_, srv := plctest.NewServer(t)
	local, err := plc.NewClient(srv.URL, rot, nil)
	require.NoError(t, err)
	did, op, err := local.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://localhost:2583"})
	require.NoError(t, err)
	require.ErrorIs(t, public.Submit(ctx, did, op), plc.ErrInsecureEndpoint)
	require.Zero(t, rt.calls.Load(), "nothing was sent")

	// https endpoints go through the check (and then to the transport).
	_, _, err = public.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "https://pds.example.com"})
	require.NoError(t, err)
}

func TestIsLocalHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"localhost": true, "LOCALHOST": true, "pds.localhost": true, "pds.test": true, "pds.test.": true,
		"127.0.0.1": true, "::1": true, "[::1]": true, "10.1.2.3": true, "192.168.0.9": true, "172.16.0.1": true,
		"169.254.1.1": true, "fd00::1": true, "fe80::1": true,
		"plc.directory": false, "pds.example.com": false, "8.8.8.8": false, "2001:db8::1": false,
		"localhost.example.com": false, "test": false, "": false,
	} {
		require.Equal(t, want, plc.IsLocalHost(host), host)
	}
	for url, want := range map[string]bool{
		"https://plc.directory": true, "http://plc.example.com:8080": true, "::nope": true,
		"http://127.0.0.1:2582": false, "http://localhost:2583": false, "http://plc.test": false,
	} {
		require.Equal(t, want, plc.IsPublicDirectory(url), url)
	}
}
