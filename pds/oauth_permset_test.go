package pds

import (
	"context"
	"html"
	"net/http"
	"net/netip"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/devdns"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/outbound"
)

// Permission sets published on this very server: an account's repository
// holds the set's lexicon record, a DNS server on this machine names that
// account's DID for the set's authority, and the server resolves and
// verifies the set (DNS, its development PLC, sync.getRecord with its own
// proof CAR) when an app asks for it.
const (
	permSetNSID = "test.bulwark.perm.authPosts"
	permSetDNS  = "_lexicon.perm.bulwark.test"
)

// newPermSetEnv is an OAuth server whose outbound lookups go to a DNS
// server of the test's, reaching this machine.
func newPermSetEnv(t *testing.T) (*oauthEnv, *devdns.Server) {
	t.Helper()
	dns, err := devdns.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(dns.Close)
	dns.SetAddr("localhost", netip.MustParseAddr("127.0.0.1"))
	e := newOAuthEnv(t, oauthEnvOptions{options: func(o *Options) {
		o.Outbound = outbound.New(outbound.Config{Resolver: dns.Resolver(), AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	}})
	return e, dns
}

// publishSet writes a permission set's lexicon record into u's repository.
func (e *oauthEnv) publishSet(u *user, nsid string, perms ...map[string]any) {
	e.post(e.t, "com.atproto.repo.putRecord", u.access, map[string]any{
		"repo": u.did.String(), "collection": "com.atproto.lexicon.schema", "rkey": nsid, "validate": false,
		"record": map[string]any{"$type": "com.atproto.lexicon.schema", "lexicon": 1, "id": nsid,
			"defs": map[string]any{"main": map[string]any{"type": "permission-set", "title": "Perm posts",
				"detail": "Write perm posts.", "permissions": perms}}},
	}).ok(e.t)
}

// TestOAuthPermissionSetPublishedHere: an app asking for an include:
// scope sees the set's permissions on the consent page and its session
// gets exactly those: records of the set's namespace, methods through
// service auth, and not what the set tried to reach outside it.
func TestOAuthPermissionSetPublishedHere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, dns := newPermSetEnv(t)
	publisher := e.newUser()
	e.publishSet(publisher, permSetNSID,
		map[string]any{"type": "permission", "resource": "repo", "collection": []string{"test.bulwark.perm.post"}, "action": []string{"create"}},
		map[string]any{"type": "permission", "resource": "rpc", "lxm": []string{"test.bulwark.perm.getFeed"}, "aud": "*"},
		map[string]any{"type": "permission", "resource": "repo", "collection": []string{"app.bsky.feed.post"}},
		map[string]any{"type": "permission", "resource": "rpc", "lxm": []string{"app.bsky.feed.getTimeline"}, "aud": "*"},
	)
	dns.SetTXT(permSetDNS, "did="+publisher.did.String())

	u := e.newUser()
	app := e.app("permset", "atproto", "include:"+permSetNSID)
	b := e.browser()
	p := b.SignIn(e.startFlow(app, u), u.handle, u.pass)
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	page := html.UnescapeString(p.Body)
	require.Contains(t, page, "“Perm posts”")
	require.Contains(t, page, "Create records of kind test.bulwark.perm.post in your repository.")
	require.Contains(t, page, "Call the method test.bulwark.perm.getFeed on any service on your behalf.")
	require.NotContains(t, page, "app.bsky.feed")
	params := b.Approve(p)
	data, err := app.ProcessCallback(ctx, params)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"atproto", "repo:test.bulwark.perm.post?action=create", "rpc:test.bulwark.perm.getFeed?aud=*"}, data.Scopes)
	sess, err := app.ResumeSession(ctx, data.AccountDID, data.SessionID)
	require.NoError(t, err)

	e.xrpcCall(sess, http.MethodPost, "com.atproto.repo.createRecord", map[string]any{
		"repo": u.did.String(), "collection": "test.bulwark.perm.post", "record": map[string]any{"$type": "test.bulwark.perm.post", "text": "hi"},
	}).ok(t)
	requireScopeRefusal(t, e.xrpcCall(sess, http.MethodPost, "com.atproto.repo.createRecord", map[string]any{
		"repo": u.did.String(), "collection": "app.bsky.feed.post", "record": postRecord("outside the set"),
	}), "repo:app.bsky.feed.post")
	e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?"+url.Values{"aud": {"did:web:feeds.example.com"}, "lxm": {"test.bulwark.perm.getFeed"}}.Encode(), nil).ok(t)
	requireScopeRefusal(t, e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getServiceAuth?"+url.Values{"aud": {"did:web:api.bsky.app"}, "lxm": {"app.bsky.feed.getTimeline"}}.Encode(), nil), "rpc:app.bsky.feed.getTimeline")
	require.Equal(t, 1, dns.Queries(permSetDNS+"."), "resolved once; cached since")
}

// TestOAuthPermissionSetRefused: a set the DNS names no publisher for, or
// whose named publisher holds no such record, fails the pushed request
// with invalid_scope.
func TestOAuthPermissionSetRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, dns := newPermSetEnv(t)
	u := e.newUser()
	app := e.app("refused", "atproto", "include:"+permSetNSID, "include:test.bulwark.other.authPosts")
	_, err := app.SendAuthRequest(ctx, e.metadata(), []string{"atproto", "include:" + permSetNSID}, u.handle)
	require.ErrorContains(t, err, oauth.CodeInvalidScope)
	// The TXT record names an account that publishes nothing.
	dns.SetTXT("_lexicon.other.bulwark.test", "did="+u.did.String())
	_, err = app.SendAuthRequest(ctx, e.metadata(), []string{"atproto", "include:test.bulwark.other.authPosts"}, u.handle)
	require.ErrorContains(t, err, oauth.CodeInvalidScope)
	require.Equal(t, 1, dns.Queries("_lexicon.other.bulwark.test."))
}
