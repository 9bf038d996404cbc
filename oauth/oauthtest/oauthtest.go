// Package oauthtest drives the authorization server's HTML pages as a
// person's browser does, for tests of the OAuth flow: it keeps cookies,
// runs no JavaScript, posts forms with the server's Origin, and stops at
// redirects so the test sees where they lead.
package oauthtest

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

// Browser is one person's browser on one server.
type Browser struct {
	// HTTP is the browser's client: its cookie jar, no redirects followed.
	HTTP *http.Client
	t    testing.TB
	base string
}

// NewBrowser is a browser for the server at base (its public URL). client
// is the client to start from (nil: a plain one; a TLS test server's
// Client() to trust it); it is copied, not changed.
func NewBrowser(t testing.TB, base string, client *http.Client) *Browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := http.Client{}
	if client != nil {
		c = *client
	}
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Browser{HTTP: &c, t: t, base: base}
}

// Page is a fetched page.
type Page struct {
	Status int
	Header http.Header
	Body   string
}

// Get opens u.
func (b *Browser) Get(u string) *Page {
	b.t.Helper()
	resp, err := b.HTTP.Get(u)
	require.NoError(b.t, err)
	return readPage(b.t, resp)
}

// Post submits a form to path as a browser does from a page of the server.
func (b *Browser) Post(path string, form url.Values) *Page {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.base)
	resp, err := b.HTTP.Do(req)
	require.NoError(b.t, err)
	return readPage(b.t, resp)
}

func readPage(t testing.TB, resp *http.Response) *Page {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return &Page{Status: resp.StatusCode, Header: resp.Header, Body: string(body)}
}

// SignIn opens the authorization page at authURL and signs in, returning
// the page that follows (the consent page on success).
func (b *Browser) SignIn(authURL, identifier, password string) *Page {
	b.t.Helper()
	p := b.Get(authURL)
	require.Equal(b.t, http.StatusOK, p.Status, p.Body)
	form := p.FormFields(b.t, "signin-form")
	form.Set("identifier", identifier)
	form.Set("password", password)
	return b.Post(oauth.PathAuthorize, form)
}

// Approve allows the app on consent page p and returns the parameters of
// the redirect back to it.
func (b *Browser) Approve(p *Page) url.Values {
	b.t.Helper()
	form := p.FormFields(b.t, "consent-form")
	form.Set("action", "approve")
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(b.t, http.StatusSeeOther, p.Status, p.Body)
	return p.RedirectQuery(b.t)
}

// SignInAndApprove signs in, allows the app, and returns the parameters of
// the redirect back to it.
func (b *Browser) SignInAndApprove(authURL, identifier, password string) url.Values {
	b.t.Helper()
	p := b.SignIn(authURL, identifier, password)
	require.Equal(b.t, http.StatusOK, p.Status, p.Body)
	return b.Approve(p)
}

// RedirectQuery is the query of the page's Location.
func (p *Page) RedirectQuery(t testing.TB) url.Values {
	t.Helper()
	loc, err := url.Parse(p.Header.Get("Location"))
	require.NoError(t, err)
	return loc.Query()
}

var hiddenInput = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

// FormFields returns the hidden fields of the form with the given id,
// which must be on the page.
func (p *Page) FormFields(t testing.TB, id string) url.Values {
	t.Helper()
	start := strings.Index(p.Body, `<form id="`+id+`"`)
	require.GreaterOrEqual(t, start, 0, "form %s not on the page:\n%s", id, p.Body)
	end := strings.Index(p.Body[start:], "</form>")
	vals := url.Values{}
	for _, m := range hiddenInput.FindAllStringSubmatch(p.Body[start:start+end], -1) {
		vals.Set(m[1], htmlUnescape(m[2]))
	}
	return vals
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&amp;", "&", "&#43;", "+", "&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">").Replace(s)
}
