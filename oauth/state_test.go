package oauth_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
)

// rows counts the rows of every oauth_* table.
func (f *fixture) rows() map[string]int {
	out := map[string]int{}
	for _, table := range []string{"oauth_devices", "oauth_device_accounts", "oauth_requests", "oauth_grants", "oauth_spent_refresh", "oauth_used_values"} {
		var n int
		require.NoError(f.t, f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
		out[table] = n
	}
	return out
}

// TestPagesStoreNothingBeforeSignIn: opening the sign-in and
// connected-apps pages, from a new browser each time or one with a
// cookie, and posting their forms without a valid token, stores nothing:
// a browser is remembered only once someone signs in on it.
func TestPagesStoreNothingBeforeSignIn(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("anon", "atproto")
	authURL := c.authURL(c.parForm())
	before := f.rows()
	returning := f.browser()
	for i := range 40 {
		p := f.browser().Get(f.srv.URL + oauth.PathAccount)
		require.Equal(t, http.StatusOK, p.Status)
		require.Contains(t, p.Header.Get("Set-Cookie"), "__Host-bulwark-device=")
		p = f.browser().Get(authURL)
		if i == 0 {
			require.Equal(t, http.StatusOK, p.Status) // the first browser owns the request
		} else {
			require.Equal(t, http.StatusBadRequest, p.Status)
		}
		p = returning.Get(f.srv.URL + oauth.PathAccount)
		form := p.FormFields(t, "signin-form")
		form.Set("csrf_token", "forged")
		require.Equal(t, http.StatusForbidden, returning.Post(oauth.PathAccount, form).Status)
		require.Equal(t, http.StatusForbidden, f.browser().Post(oauth.PathAuthorize, url.Values{"action": {"deny"}}).Status)
	}
	require.Equal(t, before, f.rows())
}

// TestSignInRemembersBrowserUnderNewCookie: a sign-in is what stores a
// browser, under a fresh cookie: a cookie the browser held before (one an
// attacker could have planted) is not signed in afterwards. Signing out
// of the last account forgets the browser.
func TestSignInRemembersBrowserUnderNewCookie(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("rotate", "atproto")
	b := f.browser()
	p := b.Get(c.authURL(c.parForm()))
	planted := cookieValue(t, p.Header)
	require.Zero(t, f.rows()["oauth_devices"])

	form := p.FormFields(t, "signin-form")
	form.Set("identifier", "alice.test")
	form.Set("password", "alice password")
	consent := b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusOK, consent.Status)
	fresh := cookieValue(t, consent.Header)
	require.NotEqual(t, planted, fresh)
	rows := f.rows()
	require.Equal(t, 1, rows["oauth_devices"])
	require.Equal(t, 1, rows["oauth_device_accounts"])
	// The request followed the browser to its new cookie.
	require.NotEmpty(t, b.Approve(consent).Get("code"))

	// The old cookie is nobody's session.
	attacker := oauthtest.NewBrowser(t, f.srv.URL, f.srv.Client())
	u, _ := url.Parse(f.srv.URL)
	attacker.HTTP.Jar.SetCookies(u, []*http.Cookie{{Name: "__Host-bulwark-device", Value: planted, Path: "/", Secure: true}})
	p = attacker.Get(f.srv.URL + oauth.PathAccount)
	require.Contains(t, p.Body, `id="signin-form"`)
	require.NotContains(t, p.Body, "alice.test")

	// The browser itself is still signed in; signing out forgets it.
	p = b.Get(f.srv.URL + oauth.PathAccount)
	require.Contains(t, p.Body, "@alice.test")
	require.Equal(t, http.StatusSeeOther, b.Post(oauth.PathAccount, p.FormFields(t, "signout-form")).Status)
	rows = f.rows()
	require.Zero(t, rows["oauth_devices"])
	require.Zero(t, rows["oauth_device_accounts"])
}

func cookieValue(t *testing.T, h http.Header) string {
	t.Helper()
	for _, c := range (&http.Response{Header: h}).Cookies() {
		if c.Name == "__Host-bulwark-device" {
			return c.Value
		}
	}
	t.Fatalf("no device cookie in %v", h)
	return ""
}

// TestSpentRefreshTokensBounded: a client refreshing in a loop leaves a
// bounded number of spent refresh tokens, and the latest spent one still
// revokes the grant when it comes back.
func TestSpentRefreshTokensBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("loop", "atproto")
	a := c.tokens()
	var spent []string
	for range 80 {
		spent = append(spent, a.str("refresh_token"))
		a = c.refresh(a.str("refresh_token"))
		require.Equal(t, http.StatusOK, a.status, a.body)
	}
	require.Equal(t, 64, f.rows()["oauth_spent_refresh"])
	require.Equal(t, "invalid_grant", c.refresh(spent[len(spent)-1]).str("error"))
	require.Equal(t, "invalid_grant", c.refresh(a.str("refresh_token")).str("error"), "the reuse revoked the grant")
	require.Zero(t, f.rows()["oauth_grants"])
}

// TestAssertionIDRememberedBriefly: a client assertion's jti is kept only
// as long as its iat makes it acceptable, whatever exp it claims.
func TestAssertionIDRememberedBriefly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("farexp", "atproto")
	key := c.confidential()
	form := c.parForm()
	iat := time.Now().Unix()
	form.Set("client_assertion_type", indigo.ClientAssertionJWTBearer)
	form.Set("client_assertion", assertion(t, key, map[string]any{"iss": c.clientID, "sub": c.clientID, "aud": f.srv.URL,
		"jti": randomString(), "iat": iat, "exp": time.Now().Add(100 * 365 * 24 * time.Hour).Unix()}))
	c.par(form)
	var until time.Time
	require.NoError(t, f.pool.QueryRow(context.Background(), "SELECT expires_at FROM oauth_used_values WHERE kind = 'client-assertion'").Scan(&until))
	require.Equal(t, iat+int64((5*time.Minute+30*time.Second)/time.Second), until.Unix(), "iat plus the age an assertion may have")
}

// TestAccountRememberedOnBoundedBrowsers: signing in again and again, each
// time in a new browser, keeps an account on its most recent 32 browsers,
// and forgets the browsers it drops.
func TestAccountRememberedOnBoundedBrowsers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for range 40 {
		b := f.browser()
		form := b.Get(f.srv.URL+oauth.PathAccount).FormFields(t, "signin-form")
		form.Set("identifier", "bob.test")
		form.Set("password", "bob password")
		require.Equal(t, http.StatusSeeOther, b.Post(oauth.PathAccount, form).Status)
	}
	rows := f.rows()
	require.Equal(t, 32, rows["oauth_device_accounts"])
	require.Equal(t, 32, rows["oauth_devices"])
}

// TestLapsedSignInForgetsItsBrowser: when the last sign-in on a browser
// lapses, the cleanup forgets the browser with it, and a browser with
// another live sign-in stays.
func TestLapsedSignInForgetsItsBrowser(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.rawClient("lapse", "atproto")
	for _, id := range []string{"alice.test", "alice.test"} {
		b := f.browser()
		p := b.Get(c.authURL(c.parForm()))
		form := p.FormFields(t, "signin-form")
		form.Set("identifier", id)
		form.Set("password", "alice password")
		require.Equal(t, http.StatusOK, b.Post(oauth.PathAuthorize, form).Status)
	}
	require.Equal(t, 2, f.rows()["oauth_devices"])

	// One browser's sign-in lapses; the other's is live.
	_, err := f.pool.Exec(ctx, `UPDATE oauth_device_accounts SET expires_at = now() - interval '1 second'
		WHERE device_id = (SELECT device_id FROM oauth_device_accounts ORDER BY device_id LIMIT 1)`)
	require.NoError(t, err)
	require.NoError(t, f.oauth.Cleanup(ctx))
	rows := f.rows()
	require.Equal(t, 1, rows["oauth_devices"])
	require.Equal(t, 1, rows["oauth_device_accounts"])
}
