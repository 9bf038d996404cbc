package main

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/devdns"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
)

// TestServeOAuthPermissionSet: serve, started as the README starts it
// with its DNS lookups sent to a DNS server on this machine
// (--dns-server) and loopback allowed (--proxy-allow-private), resolves
// a permission set published in one of its own accounts (the _lexicon
// TXT record, its development PLC, sync.getRecord with its proof): an
// app asking for the include: scope sees the set's permissions on the
// consent page and its tokens allow exactly those.
func TestServeOAuthPermissionSet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dns, err := devdns.Start("127.0.0.1:0")
	require.NoError(t, err)
	defer dns.Close()
	dns.SetAddr("localhost", netip.MustParseAddr("127.0.0.1"))
	addr, done, logs := startServe(t, ctx, []string{"serve", "--database-url", dbtest.NewURL(t), "--data-dir", t.TempDir(),
		"--listen", "127.0.0.1:0", "--handle-domains", ".test", "--dns-server", dns.Addr, "--proxy-allow-private", "127.0.0.0/8"})
	base := "http://" + addr
	_, port, _ := strings.Cut(addr, ":")
	public := "http://localhost:" + port

	newAccount := func(handle string) (syntax.DID, string) {
		out := postOK(t, base, "com.atproto.server.createAccount", "", map[string]any{
			"handle": handle, "email": handle + "@example.com", "password": handle + " password"})
		return syntax.DID(out["did"].(string)), out["accessJwt"].(string)
	}
	pubDID, pubToken := newAccount("publisher.test")
	const nsid = "test.bulwark.serve.authNotes"
	postOK(t, base, "com.atproto.repo.putRecord", pubToken, map[string]any{
		"repo": pubDID, "collection": "com.atproto.lexicon.schema", "rkey": nsid,
		"record": map[string]any{"$type": "com.atproto.lexicon.schema", "lexicon": 1, "id": nsid,
			"defs": map[string]any{"main": map[string]any{"type": "permission-set", "title": "Notes",
				"permissions": []any{
					map[string]any{"type": "permission", "resource": "repo", "collection": []string{"test.bulwark.serve.note"}},
					map[string]any{"type": "permission", "resource": "repo", "collection": []string{"app.bsky.feed.post"}},
				}}}},
	})
	dns.SetTXT("_lexicon.serve.bulwark.test", "did="+pubDID.String())
	aliceDID, _ := newAccount("alice.test")

	// A development client (http://localhost client_id) through indigo.
	cfg := indigo.NewLocalhostConfig("http://127.0.0.1/callback", []string{"atproto", "include:" + nsid})
	app := indigo.NewClientApp(&cfg, indigo.NewMemStore())
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: aliceDID, Handle: "alice.test",
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: public}}})
	app.Dir = dir
	var md indigo.AuthServerMetadata
	getJSON(t, base+oauth.PathASMetadata, &md)
	info, err := app.SendAuthRequest(ctx, &md, cfg.Scopes, "alice.test")
	require.NoError(t, err)
	info.AccountDID = &aliceDID
	require.NoError(t, app.Store.SaveAuthRequestInfo(ctx, *info))

	b := oauthtest.NewBrowser(t, public, nil)
	authURL := md.AuthorizationEndpoint + "?" + url.Values{"client_id": {cfg.ClientID}, "request_uri": {info.RequestURI}}.Encode()
	p := b.SignIn(authURL, "alice.test", "alice.test password")
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	page := html.UnescapeString(p.Body)
	require.Contains(t, page, "“Notes”")
	require.Contains(t, page, "Create, change and delete records of kind test.bulwark.serve.note in your repository.")
	require.NotContains(t, page, "app.bsky.feed.post")
	data, err := app.ProcessCallback(ctx, b.Approve(p))
	require.NoError(t, err)
	require.Equal(t, []string{"atproto", "repo:test.bulwark.serve.note"}, data.Scopes)

	sess, err := app.ResumeSession(ctx, data.AccountDID, data.SessionID)
	require.NoError(t, err)
	create := func(collection string) int {
		body, _ := json.Marshal(map[string]any{"repo": aliceDID, "collection": collection, "record": map[string]any{"$type": collection, "text": "hi", "createdAt": time.Now().UTC().Format(time.RFC3339)}})
		req, err := http.NewRequest(http.MethodPost, public+"/xrpc/com.atproto.repo.createRecord", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		resp, err := sess.DoWithAuth(http.DefaultClient, req, "com.atproto.repo.createRecord")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, create("test.bulwark.serve.note"))
	require.Equal(t, http.StatusForbidden, create("app.bsky.feed.post"))

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
}
