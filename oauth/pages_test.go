package oauth_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
)

// authURL pushes a request for c and returns the URL the browser opens.
func (c *rawClient) authURL(form url.Values) string {
	uri := c.par(form)
	q := url.Values{"client_id": {c.clientID}, "request_uri": {uri}}
	return c.f.srv.URL + oauth.PathAuthorize + "?" + q.Encode()
}

var (
	inputRE = regexp.MustCompile(`<input id="([^"]+)"[^>]*type="(text|password)"`)
	h1RE    = regexp.MustCompile(`<h1[ >]`)
)

// checkPage asserts what every page must be: one h1, a label for every
// visible input, a CSRF token in every form, no script, and the headers.
func checkPage(t *testing.T, p *oauthtest.Page) {
	t.Helper()
	require.Len(t, h1RE.FindAllString(p.Body, -1), 1, p.Body)
	for _, m := range inputRE.FindAllStringSubmatch(p.Body, -1) {
		require.Contains(t, p.Body, `<label for="`+m[1]+`">`, "input %s has no label", m[1])
	}
	require.Equal(t, strings.Count(p.Body, "<form "), strings.Count(p.Body, `name="csrf_token"`))
	require.NotContains(t, p.Body, "<script")
	csp := p.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "style-src 'self'", "form-action 'self'", "frame-ancestors 'none'"} {
		require.Contains(t, csp, want)
	}
	require.Equal(t, "no-store", p.Header.Get("Cache-Control"))
	require.Equal(t, "DENY", p.Header.Get("X-Frame-Options"))
}

func TestPagesAndCookies(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("pages", "atproto transition:generic transition:email")
	b := f.browser()
	p := b.Get(c.authURL(c.parForm()))
	require.Equal(t, http.StatusOK, p.Status)
	checkPage(t, p)
	ck := p.Header.Get("Set-Cookie")
	require.Contains(t, ck, "__Host-bulwark-device=")
	for _, attr := range []string{"HttpOnly", "Secure", "SameSite=Lax", "Path=/"} {
		require.Contains(t, ck, attr)
	}
	// The consent page may submit to the client's redirect origin.
	require.Contains(t, p.Header.Get("Content-Security-Policy"), "form-action 'self' "+f.srv.URL)

	// Wrong password: the sign-in page again, with a message.
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", "alice.test")
	form.Set("password", "wrong")
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusUnauthorized, p.Status)
	checkPage(t, p)
	require.Contains(t, p.Body, "Wrong handle, email or password.")
	require.Contains(t, p.Body, `value="alice.test"`)

	f.accounts.mu.Lock()
	f.accounts.rateLimit = true
	f.accounts.mu.Unlock()
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusTooManyRequests, p.Status)
	require.Contains(t, p.Body, "Too many sign-in attempts")
	f.accounts.mu.Lock()
	f.accounts.rateLimit = false
	f.accounts.mu.Unlock()

	form.Set("password", "alice password")
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusOK, p.Status)
	checkPage(t, p)
	require.Contains(t, p.Body, "@alice.test")
	require.Contains(t, p.Body, c.clientID)
	require.Contains(t, p.Body, "See your email address")
	require.Contains(t, p.Body, "It cannot change your handle")

	// The style sheet is served from here.
	resp, err := b.HTTP.Get(f.srv.URL + oauth.PathStyle)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/css; charset=utf-8", resp.Header.Get("Content-Type"))
}

func TestConsentNeedsCSRFToken(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("csrf", "atproto")
	b := f.browser()
	p := b.Get(c.authURL(c.parForm()))
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", "alice.test")
	form.Set("password", "alice password")
	consent := b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusOK, consent.Status)
	approve := consent.FormFields(t, "consent-form")
	approve.Set("action", "approve")

	for name, edit := range map[string]func(url.Values){
		"missing": func(v url.Values) { v.Del("csrf_token") },
		"wrong":   func(v url.Values) { v.Set("csrf_token", "forged") },
	} {
		v := url.Values{}
		for k, vs := range approve {
			v[k] = vs
		}
		edit(v)
		p := b.Post(oauth.PathAuthorize, v)
		require.Equal(t, http.StatusForbidden, p.Status, name)
		require.Empty(t, p.Header.Get("Location"), name)
		require.Contains(t, p.Body, "This form has expired")
		checkPage(t, p)
	}
	// The right token from another browser does not work either: it is
	// bound to this browser's cookie.
	other := f.browser()
	p = other.Post(oauth.PathAuthorize, approve)
	require.Equal(t, http.StatusForbidden, p.Status)

	// A cross-site submission is refused even with the token.
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+oauth.PathAuthorize, strings.NewReader(approve.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := b.HTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	// The real form still works.
	params := b.Approve(consent)
	require.NotEmpty(t, params.Get("code"))
}

func TestChooseAccountAndLoginHint(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("choose", "atproto")
	b := f.browser()
	b.SignInAndApprove(c.authURL(c.parForm()), "alice.test", "alice password")

	// Second request: alice is signed in, so straight to consent; switch
	// to bob from there.
	p := b.Get(c.authURL(c.parForm()))
	require.Contains(t, p.Body, `id="consent-form"`)
	p = b.Post(oauth.PathAuthorize, p.FormFields(t, "another-form"))
	require.Contains(t, p.Body, `id="signin-form"`)
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", "bob.test")
	form.Set("password", "bob password")
	b.Approve(b.Post(oauth.PathAuthorize, form))

	// Third request: two accounts signed in, so a choice.
	p = b.Get(c.authURL(c.parForm()))
	require.Equal(t, http.StatusOK, p.Status)
	checkPage(t, p)
	require.Contains(t, p.Body, "Choose an account")
	require.Contains(t, p.Body, "@alice.test")
	require.Contains(t, p.Body, "@bob.test")
	var bobForm string
	for _, id := range []string{"choose-0", "choose-1"} {
		if p.FormFields(t, id).Get("did") == bobDID {
			bobForm = id
		}
	}
	p = b.Post(oauth.PathAuthorize, p.FormFields(t, bobForm))
	require.Contains(t, p.Body, "@bob.test")
	params := b.Approve(p)
	a := c.exchange(params.Get("code"))
	require.Equal(t, bobDID, a.str("sub"))

	// A login_hint picks the account; signing in as someone else is refused.
	form = c.parForm()
	form.Set("login_hint", "alice.test")
	p = b.Get(c.authURL(form))
	require.Contains(t, p.Body, `id="consent-form"`)
	require.Contains(t, p.Body, "@alice.test")
	require.NotContains(t, p.Body, "@bob.test")

	nb := f.browser()
	form = c.parForm()
	form.Set("login_hint", "alice.test")
	p = nb.Get(c.authURL(form))
	require.Contains(t, p.Body, `value="alice.test"`)
	sf := p.FormFields(t, "signin-form")
	sf.Set("identifier", "bob.test")
	sf.Set("password", "bob password")
	p = nb.Post(oauth.PathAuthorize, sf)
	require.Equal(t, http.StatusForbidden, p.Status)
	require.Contains(t, p.Body, "Sign in with that account")
}

func TestDenyAndStaleLinks(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("deny", "atproto")
	b := f.browser()
	authURL := c.authURL(c.parForm())
	p := b.Get(authURL)
	p = b.Post(oauth.PathAuthorize, p.FormFields(t, "cancel-form"))
	require.Equal(t, http.StatusSeeOther, p.Status)
	params := p.RedirectQuery(t)
	require.Equal(t, "access_denied", params.Get("error"))
	require.Equal(t, c.state, params.Get("state"))
	require.Equal(t, f.srv.URL, params.Get("iss"))

	// The request is gone.
	p = b.Get(authURL)
	require.Equal(t, http.StatusBadRequest, p.Status)
	checkPage(t, p)
	require.Contains(t, p.Body, "This sign-in link can&#39;t be used")

	// A request opened in one browser cannot be finished in another.
	authURL = c.authURL(c.parForm())
	b.Get(authURL)
	p = f.browser().Get(authURL)
	require.Equal(t, http.StatusBadRequest, p.Status)

	// Nonsense links get a page, not a 500.
	for _, q := range []string{"request_uri=nope", "client_id=x&request_uri=urn:ietf:params:oauth:request_uri:req-%00", "client_id=%00&request_uri=urn:ietf:params:oauth:request_uri:req-x"} {
		p = b.Get(f.srv.URL + oauth.PathAuthorize + "?" + q)
		require.Equal(t, http.StatusBadRequest, p.Status, q)
		checkPage(t, p)
	}
}

func TestAccountPageListsAndRevokes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("acct", "atproto transition:generic")
	b := f.browser()
	params := b.SignInAndApprove(c.authURL(c.parForm()), "alice.test", "alice password")
	a := c.exchange(params.Get("code"))
	require.Equal(t, http.StatusOK, a.status)

	grants, err := f.oauth.ListGrants(t.Context(), aliceDID)
	require.NoError(t, err)
	require.Len(t, grants, 1)
	require.Equal(t, c.clientID, grants[0].ClientID)

	p := b.Get(f.srv.URL + oauth.PathAccount)
	require.Equal(t, http.StatusOK, p.Status)
	checkPage(t, p)
	require.Contains(t, p.Body, c.clientID)
	p = b.Post(oauth.PathAccount, p.FormFields(t, "revoke-0"))
	require.Equal(t, http.StatusSeeOther, p.Status)
	p = b.Get(f.srv.URL + p.Header.Get("Location"))
	require.Contains(t, p.Body, "Access removed")
	require.Contains(t, p.Body, `id="no-grants"`)
	require.Equal(t, http.StatusUnauthorized, c.call(a.str("access_token"), c.key, "").StatusCode)

	// A made-up grant id is no error page.
	p = b.Get(f.srv.URL + oauth.PathAccount)
	bad := p.FormFields(t, "signout-form")
	bad.Set("action", "revoke")
	bad.Set("grant", "grant-\x00")
	require.Equal(t, http.StatusSeeOther, b.Post(oauth.PathAccount, bad).Status)

	// Another browser sees a sign-in form, and cannot revoke alice's grants.
	other := f.browser()
	p = other.Get(f.srv.URL + oauth.PathAccount)
	checkPage(t, p)
	require.Contains(t, p.Body, `id="signin-form"`)
	require.ErrorIs(t, f.oauth.RevokeGrant(t.Context(), bobDID, grants[0].ID), oauth.ErrGrantNotFound)

	// Revoking everything of an account.
	params = b.Approve(b.Get(c.authURL(c.parForm()))) // still signed in
	a = c.exchange(params.Get("code"))
	require.Equal(t, http.StatusOK, c.call(a.str("access_token"), c.key, "").StatusCode)
	require.NoError(t, oauth.RevokeAllGrants(t.Context(), f.pool, aliceDID))
	require.Equal(t, http.StatusUnauthorized, c.call(a.str("access_token"), c.key, "").StatusCode)

	// Signing out forgets the account on this browser.
	p = b.Get(f.srv.URL + oauth.PathAccount)
	p = b.Post(oauth.PathAccount, p.FormFields(t, "signout-form"))
	require.Equal(t, http.StatusSeeOther, p.Status)
	p = b.Get(f.srv.URL + oauth.PathAccount)
	require.Contains(t, p.Body, `id="signin-form"`)
}
