package oauth_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
)

// silently pushes a prompt=none request for scope (c's whole scope when
// empty) with login_hint hint, opens it in b, and returns where the
// browser is sent back to: no page is ever shown.
func silently(t *testing.T, c *rawClient, b *oauthtest.Browser, scope, hint string) url.Values {
	t.Helper()
	form := c.parForm()
	form.Set("prompt", "none")
	if scope != "" {
		form.Set("scope", scope)
	}
	if hint != "" {
		form.Set("login_hint", hint)
	}
	p := b.Get(c.authURL(form))
	require.Equal(t, http.StatusSeeOther, p.Status, p.Body)
	q := p.RedirectQuery(t)
	require.Equal(t, c.state, q.Get("state"))
	require.Equal(t, c.f.srv.URL, q.Get("iss"))
	return q
}

// approveAs runs an interactive request of c for scope in b, signing in
// as handle when the browser asks, and returns the code.
func approveAs(t *testing.T, c *rawClient, b *oauthtest.Browser, scope, handle, password string) string {
	t.Helper()
	form := c.parForm()
	form.Set("scope", scope)
	form.Set("login_hint", handle)
	p := b.Get(c.authURL(form))
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	if !strings.Contains(p.Body, `<form id="consent-form"`) {
		sf := p.FormFields(t, "signin-form")
		sf.Set("identifier", handle)
		sf.Set("password", password)
		p = b.Post(oauth.PathAuthorize, sf)
	}
	return b.Approve(p).Get("code")
}

// TestPromptNone: a confidential app that holds a live grant covering
// what it asks for gets a code with no page shown; otherwise it is sent
// back with login_required, consent_required or
// account_selection_required, and learns nothing of accounts that have
// granted it nothing.
func TestPromptNone(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("silent", "atproto transition:generic")
	c.assertKey = c.confidential()
	other := f.rawClient("other", "atproto")
	b := f.browser()

	require.Equal(t, oauth.CodeLoginRequired, silently(t, c, b, "", "").Get("error"), "no one signed in")

	// Alice signs in here for another app: to this one, the browser still
	// looks empty, with or without her handle as a hint.
	require.NotEmpty(t, approveAs(t, other, b, "atproto", "alice.test", "alice password"))
	require.Equal(t, oauth.CodeLoginRequired, silently(t, c, b, "", "").Get("error"))
	require.Equal(t, oauth.CodeLoginRequired, silently(t, c, b, "", "alice.test").Get("error"))

	// Alice allows this app "atproto": asking silently for more needs her
	// consent; asking for that much is granted.
	c.exchange(approveAs(t, c, b, "atproto", "alice.test", "alice password"))
	require.Equal(t, oauth.CodeConsentRequired, silently(t, c, b, "", "").Get("error"))
	q := silently(t, c, b, "atproto", "")
	require.Empty(t, q.Get("error"), q)
	a := c.exchange(q.Get("code"))
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, aliceDID, a.str("sub"))
	require.Equal(t, "atproto", a.str("scope"))

	// Once she has allowed all of it, any part of it is silent.
	c.exchange(approveAs(t, c, b, "atproto transition:generic", "alice.test", "alice password"))
	for _, scope := range []string{"atproto transition:generic", "atproto"} {
		q := silently(t, c, b, scope, "")
		a := c.exchange(q.Get("code"))
		require.Equal(t, http.StatusOK, a.status, "%s: %v %v", scope, q, a.body)
		require.Equal(t, scope, a.str("scope"))
		require.Equal(t, http.StatusOK, c.call(a.str("access_token"), c.key, "").StatusCode)
	}

	// Bob signs in on the same browser and allows the app too: without a
	// hint the app must say which account.
	c.exchange(approveAs(t, c, b, "atproto transition:generic", "bob.test", "bob password"))
	require.Equal(t, oauth.CodeAccountSelectionRequired, silently(t, c, b, "", "").Get("error"))
	a = c.exchange(silently(t, c, b, "", "bob.test").Get("code"))
	require.Equal(t, bobDID, a.str("sub"))

	// Alice takes the app's access back: for her, it is as if she were
	// not signed in here; bob's remains.
	grants, err := f.oauth.ListGrants(t.Context(), aliceDID)
	require.NoError(t, err)
	for _, g := range grants {
		if g.ClientID == c.clientID {
			require.NoError(t, f.oauth.RevokeGrant(t.Context(), aliceDID, g.ID))
		}
	}
	require.Equal(t, oauth.CodeLoginRequired, silently(t, c, b, "", "alice.test").Get("error"))
	a = c.exchange(silently(t, c, b, "", "").Get("code"))
	require.Equal(t, bobDID, a.str("sub"), "bob is the only account the app may use here")

	// Another browser, where no one is signed in.
	require.Equal(t, oauth.CodeLoginRequired, silently(t, c, f.browser(), "", "bob.test").Get("error"))
}

// TestPromptNonePublicClient: an app without client authentication never
// signs in silently (anyone can use its client_id): consent_required,
// whatever it was allowed before; the request is then gone.
func TestPromptNonePublicClient(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("public", "atproto")
	b := f.browser()
	c.exchange(approveAs(t, c, b, "atproto", "alice.test", "alice password"))
	form := c.parForm()
	form.Set("prompt", "none")
	u := c.authURL(form)
	p := b.Get(u)
	require.Equal(t, http.StatusSeeOther, p.Status)
	require.Equal(t, oauth.CodeConsentRequired, p.RedirectQuery(t).Get("error"))
	require.Equal(t, http.StatusBadRequest, b.Get(u).Status, "the request was ended")
}

// TestPromptNoneTrustedClient: a public app the operator trusts may sign
// in silently.
func TestPromptNoneTrustedClient(t *testing.T) {
	t.Parallel()
	var c *rawClient
	f := setup(t, fixtureOpts{configure: func(cfg *oauth.Config) {
		cfg.TrustedClients = []string{cfg.Issuer + "/client/trusted.json"}
	}})
	c = f.rawClient("trusted", "atproto")
	b := f.browser()
	c.exchange(approveAs(t, c, b, "atproto", "alice.test", "alice password"))
	a := c.exchange(silently(t, c, b, "", "").Get("code"))
	require.Equal(t, aliceDID, a.str("sub"))
}

// TestGrantsPerAppBounded: an app keeps at most its 20 newest grants of
// one account, however often it signs in (silently or not); a newer one
// ends the oldest.
func TestGrantsPerAppBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("again", "atproto")
	c.assertKey = c.confidential()
	b := f.browser()
	first := c.exchange(approveAs(t, c, b, "atproto", "alice.test", "alice password"))
	require.Equal(t, http.StatusOK, first.status, first.body)
	for range 20 {
		a := c.exchange(silently(t, c, b, "", "").Get("code"))
		require.Equal(t, http.StatusOK, a.status, a.body)
	}
	grants, err := f.oauth.ListGrants(t.Context(), aliceDID)
	require.NoError(t, err)
	require.Len(t, grants, 20)
	require.Equal(t, "invalid_grant", c.refresh(first.str("refresh_token")).str("error"), "the oldest grant ended")
	require.Equal(t, http.StatusUnauthorized, c.call(first.str("access_token"), c.key, "").StatusCode)
}
