package console_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/console"
)

// setCookie returns the value of the cookie named name that p sets.
func (p page) setCookie(t *testing.T, name string) string {
	t.Helper()
	for _, c := range (&http.Response{Header: p.header}).Cookies() {
		if c.Name == name && c.Value != "" {
			return c.Value
		}
	}
	t.Fatalf("the page sets no cookie %s", name)
	return ""
}

// withCookie is a browser holding only the console cookie name=value.
func (e *env) withCookie(t *testing.T, name, value string) *browser {
	b := e.browser(t)
	u, err := url.Parse(e.url + console.Prefix)
	require.NoError(t, err)
	b.c.Jar.SetCookies(u, []*http.Cookie{{Name: name, Value: value, Path: "/admin"}})
	return b
}

// Nothing the login page hands an anonymous visitor stands for anything
// after a login: its cookie and its CSRF token, sent as the session
// cookie, are no session (no page, no action, no password reset), and a
// session's values are no login attempt.
func TestLoginValuesAreNoSession(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	did, _ := e.newRepo(t, "victim.test")
	form := e.browser(t).get(console.Prefix + "login")
	require.Equal(t, http.StatusOK, form.status)
	loginCookie, loginCSRF := form.setCookie(t, "bulwark_console_login"), form.csrf(t)

	for name, v := range map[string]string{"login cookie": loginCookie, "login CSRF token": loginCSRF} {
		b := e.withCookie(t, "bulwark_console", v)
		p := b.get(console.Prefix)
		require.Equal(t, http.StatusSeeOther, p.status, "the %s opened the overview", name)
		require.Equal(t, http.StatusSeeOther, b.get(console.Prefix+"accounts/"+did.String()).status, name)
		for _, csrf := range []string{loginCSRF, v} {
			p = b.post(console.Prefix+"accounts/"+did.String()+"/password", url.Values{"csrf": {csrf}, "generate": {"1"}})
			require.Equal(t, http.StatusForbidden, p.status, "the %s reset a password", name)
		}
	}
	_, _, err := e.accounts.Login(context.Background(), "victim.test", "a password for victim.test")
	require.NoError(t, err, "the password is unchanged")

	// A session's CSRF token is no login form's, the login form's is no
	// session's, and the session cookie is no login attempt.
	b := e.browser(t)
	b.mustLogin()
	home := b.get(console.Prefix)
	sessionCSRF := home.csrf(t)
	require.Equal(t, http.StatusForbidden, b.post(console.Prefix+"relays/check", url.Values{"csrf": {loginCSRF}}).status)
	require.Equal(t, http.StatusSeeOther, b.post(console.Prefix+"relays/check", url.Values{"csrf": {sessionCSRF}}).status)
	var sessionCookie string
	u, _ := url.Parse(e.url + console.Prefix)
	for _, c := range b.c.Jar.Cookies(u) {
		if c.Name == "bulwark_console" {
			sessionCookie = c.Value
		}
	}
	require.NotEmpty(t, sessionCookie)
	for _, v := range []string{sessionCookie, sessionCSRF} {
		attempt := e.withCookie(t, "bulwark_console_login", v)
		p := attempt.post(console.Prefix+"login", url.Values{"csrf": {sessionCSRF}, "password": {adminPassword}})
		require.Equal(t, http.StatusForbidden, p.status, "a session value logged in as a login attempt")
	}
}
