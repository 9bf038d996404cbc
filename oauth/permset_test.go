package oauth_test

import (
	"html"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

const (
	postsSet = "com.example.authPosts"
	svcAud   = "did:web:api.example.com#svc"
)

// setupSets is a fixture whose server resolves permission sets from lx.
func setupSets(t *testing.T, lx *lexicons) *fixture {
	return setup(t, fixtureOpts{configure: func(c *oauth.Config) { c.Lexicons = lx }})
}

// publishPostsSet publishes com.example.authPosts: what it may grant, and
// what a set may not (other namespaces, wildcards, fixed audiences,
// resources sets cannot hold, fields this server does not know).
func publishPostsSet(t *testing.T, lx *lexicons) {
	lx.publish(t, postsSet, "Post for you",
		repoPerm([]string{"create"}, "com.example.post"),
		repoPerm(nil, "com.example.feed.like", "com.example.feed.repost"),
		rpcPerm("", true, "com.example.getFeed", "com.example.feed.getLikes"),
		rpcPerm("*", false, "com.example.report"),
		// Refused, each whole:
		repoPerm(nil, "com.other.post"),
		repoPerm(nil, "com.example.post", "app.bsky.feed.post"),
		repoPerm(nil, "*"),
		repoPerm(nil, "com.examplex.post"),
		rpcPerm("did:web:evil.example#svc", false, "com.example.leak"),
		rpcPerm("*", true, "com.example.both"),
		rpcPerm("", false, "com.example.noaud"),
		map[string]any{"type": "permission", "resource": "repo", "collection": []string{"com.example.secret"}, "onlyOnTuesdays": true},
		map[string]any{"type": "permission", "resource": "blob", "accept": []string{"*/*"}},
		map[string]any{"type": "permission", "resource": "identity", "attr": "*"},
		map[string]any{"type": "permission", "resource": "account", "attr": "email", "action": "manage"},
	)
}

// postsSetGrants are the permissions com.example.authPosts grants through
// include:...?aud=svcAud, and nothing else.
func postsSetGrants() []string {
	perms := []auth.Permission{
		{Resource: "repo", Collection: []string{"com.example.post"}, Action: []string{"create"}},
		{Resource: "repo", Collection: []string{"com.example.feed.like", "com.example.feed.repost"}},
		{Resource: "rpc", Endpoint: []string{"com.example.getFeed", "com.example.feed.getLikes"}, Audience: svcAud},
		{Resource: "rpc", Endpoint: []string{"com.example.report"}, Audience: "*"},
	}
	out := []string{"atproto"}
	for _, p := range perms {
		out = append(out, strings.ReplaceAll(p.ScopeString(), "%2A", "*"))
	}
	return out
}

// TestPermissionSetFlow: an app asking for an include: scope sees the
// set's permissions on the consent page in plain words, and its tokens
// get exactly those: the token endpoint answers the expanded scope, and
// the resource checks follow it.
func TestPermissionSetFlow(t *testing.T) {
	t.Parallel()
	lx := newLexicons()
	publishPostsSet(t, lx)
	f := setupSets(t, lx)
	include := "include:" + postsSet + "?aud=" + url.QueryEscape(svcAud)
	c := f.rawClient("sets", "atproto "+include)

	b := f.browser()
	p := b.Get(c.authURL(c.parForm()))
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", "alice.test")
	form.Set("password", "alice password")
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	checkPage(t, p)
	body := html.UnescapeString(p.Body)
	for _, want := range []string{
		"“Post for you”", "published by <strong>example.com</strong>", "What Post for you is for.",
		"Create records of kind com.example.post in your repository.",
		"Create, change and delete records of kind com.example.feed.like, com.example.feed.repost",
		"Call the method com.example.getFeed, com.example.feed.getLikes on the service " + svcAud,
		"Call the method com.example.report on any service",
	} {
		require.Contains(t, body, want)
	}
	for _, never := range []string{"com.other.post", "app.bsky.feed.post", "evil.example", "com.example.both",
		"com.example.noaud", "com.example.secret", "Upload", "Change your handle", "email address"} {
		require.NotContains(t, body, never)
	}
	params := b.Approve(p)
	a := c.exchange(params.Get("code"))
	require.Equal(t, http.StatusOK, a.status, a.body)
	granted := strings.Fields(a.str("scope"))
	want := postsSetGrants()
	slices.Sort(granted)
	slices.Sort(want)
	require.Equal(t, want, granted, "the token endpoint answers the set's permissions, expanded")

	access := a.str("access_token")
	for query, status := range map[string]int{
		"check=repo&collection=com.example.post&action=create":                                 http.StatusOK,
		"check=repo&collection=com.example.post&action=delete":                                 http.StatusForbidden,
		"check=repo&collection=com.example.feed.like&action=delete":                            http.StatusOK,
		"check=repo&collection=com.other.post&action=create":                                   http.StatusForbidden,
		"check=repo&collection=app.bsky.feed.post&action=create":                               http.StatusForbidden,
		"check=repo&collection=com.example.secret&action=create":                               http.StatusForbidden,
		"check=rpc&lxm=com.example.getFeed&aud=" + url.QueryEscape(svcAud):                     http.StatusOK,
		"check=rpc&lxm=com.example.getFeed&aud=" + url.QueryEscape("did:web:evil.example#svc"): http.StatusForbidden,
		"check=rpc&lxm=com.example.report&aud=" + url.QueryEscape("did:web:any.example#mod"):   http.StatusOK,
		"check=rpc&lxm=com.example.leak&aud=" + url.QueryEscape("did:web:evil.example#svc"):    http.StatusForbidden,
		"check=blob&mime=image/png":                                                            http.StatusForbidden,
	} {
		require.Equal(t, status, c.call(access, c.key, query).StatusCode, query)
	}
	require.Equal(t, 1, lx.count(postsSet), "resolved once, at the pushed request; then cached")

	// The connected-apps page names the set the access came through.
	acct := html.UnescapeString(b.Get(f.srv.URL + oauth.PathAccount).Body)
	require.Contains(t, acct, "Granted through the permission set “Post for you” ("+postsSet+"), published by example.com.")
	require.Contains(t, acct, "Create records of kind com.example.post in your repository.")
}

// TestPermissionSetWithoutAudience: rpc permissions that inherit the
// include's audience are dropped when the include names none.
func TestPermissionSetWithoutAudience(t *testing.T) {
	t.Parallel()
	lx := newLexicons()
	publishPostsSet(t, lx)
	f := setupSets(t, lx)
	c := f.rawClient("noaud", "atproto include:"+postsSet)
	a := c.tokens()
	require.NotContains(t, a.str("scope"), "getFeed")
	require.Contains(t, a.str("scope"), "com.example.report")
	require.Equal(t, http.StatusForbidden, c.call(a.str("access_token"), c.key, "check=rpc&lxm=com.example.getFeed&aud="+url.QueryEscape(svcAud)).StatusCode)
}

// TestPermissionSetChangedBeforeApproval: when the set changes between
// the consent page and the approval, the page is shown again with what it
// grants now; the person approves what they saw.
func TestPermissionSetChangedBeforeApproval(t *testing.T) {
	t.Parallel()
	lx := newLexicons()
	const nsid = "com.example.authDrafts"
	lx.publish(t, nsid, "Drafts", repoPerm([]string{"create"}, "com.example.draft"))
	f := setupSets(t, lx)
	c := f.rawClient("drafts", "atproto include:"+nsid)
	b := f.browser()
	p := b.SignIn(c.authURL(c.parForm()), "alice.test", "alice password")
	require.Contains(t, p.Body, "Create records of kind com.example.draft")

	lx.publish(t, nsid, "Drafts", repoPerm(nil, "com.example.draft"))
	f.oauth.AgeSets(oauth.SetFreshFor)
	form := p.FormFields(t, "consent-form")
	form.Set("action", "approve")
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusOK, p.Status, "shown again, not approved")
	require.Contains(t, p.Body, "has changed since the page was shown")
	require.Contains(t, html.UnescapeString(p.Body), "Create, change and delete records of kind com.example.draft")
	a := c.exchange(b.Approve(p).Get("code"))
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, "atproto repo:com.example.draft", a.str("scope"))
}
