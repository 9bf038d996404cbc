package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Wherever next points, a login leads to a console page on this host:
// not to another host, not out of the console by dot segments or
// encoded slashes.
func TestLoginNextStaysInConsole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{loginRules: []ratelimit.Rule{{Name: "5m", Limit: 1000, Window: 5 * time.Minute}}})
	for next, want := range map[string]string{
		"/admin/accounts?q=alice":             "/admin/accounts?q=alice",
		"/admin/firehose/event/12":            "/admin/firehose/event/12",
		"/admin/":                             "/admin/",
		"/admin":                              "/admin",
		"//evil.example":                      "/admin/",
		"https://evil.example/admin/":         "/admin/",
		"/admin/../../evil":                   "/admin/",
		"/admin/..//evil.example":             "/admin/",
		"/admin/../admin/audit":               "/admin/audit",
		"/admin//evil.example":                "/admin/evil.example",
		"/admin/%2F..%2F..%2Fevil":            "/admin/",
		`/admin/\evil.example`:                "/admin/",
		"/admin/\t/evil.example":              "/admin/",
		"/admin/\r\nSet-Cookie: x=y":          "/admin/",
		"javascript:alert(1)":                 "/admin/",
		"/%61dmin/audit":                      "/admin/audit",
		"http:/admin/":                        "/admin/",
		"/admin@evil.example/":                "/admin/",
		"":                                    "/admin/",
		"/admin/" + strings.Repeat("a", 3000): "/admin/",
	} {
		b := e.browser(t)
		form := b.get(console.Prefix + "login")
		p := b.post(console.Prefix+"login", url.Values{"csrf": {form.csrf(t)}, "password": {adminPassword}, "next": {next}})
		require.Equal(t, http.StatusSeeOther, p.status, "%q: %s", next, p.body)
		require.Equal(t, want, p.header.Get("Location"), "next %q", next)
	}
}

// An Origin that is not a bare origin is no same-origin request, even
// when its host is ours.
func TestOriginMustBeBare(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	b := e.browser(t)
	b.mustLogin()
	csrf := b.get(console.Prefix).csrf(t)
	for origin, want := range map[string]int{
		"http://" + e.host:                   http.StatusSeeOther,
		"http://evil.example@" + e.host:      http.StatusForbidden,
		"http://" + e.host + "/path":         http.StatusForbidden,
		"http://" + e.host + ".evil.example": http.StatusForbidden,
		"ftp://" + e.host:                    http.StatusForbidden,
		"null":                               http.StatusForbidden,
	} {
		req, err := http.NewRequest(http.MethodPost, e.url+console.Prefix+"relays/check", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		resp, err := b.c.Do(req)
		require.NoError(t, err)
		require.Equal(t, want, read(t, resp).status, origin)
	}
}

// Every console request spends a point of the address's global limit,
// logged in or not: past it, a 429 with Retry-After.
func TestConsoleRequestsLimited(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{globalRules: []ratelimit.Rule{{Name: "5m", Limit: 4, Window: 5 * time.Minute}}})
	b := e.browser(t)
	for _, path := range []string{"login", "login", "static/console.css", ""} {
		require.NotEqual(t, http.StatusTooManyRequests, b.get(console.Prefix+path).status, path)
	}
	p := b.get(console.Prefix + "login")
	require.Equal(t, http.StatusTooManyRequests, p.status)
	require.NotEmpty(t, p.header.Get("Retry-After"))
	require.Contains(t, p.body, "Too many requests from your address")
}
