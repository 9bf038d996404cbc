package oauth_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

// TestSignInBusy: a sign-in the server cannot check now (its password
// queue is full) is answered 503 with Retry-After and the sign-in form,
// saying to try again in a few seconds, on the authorization page and
// on the connected-apps page; the retry then works.
func TestSignInBusy(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.rawClient("busy", "atproto")
	b := f.browser()
	p := b.Get(c.authURL(c.parForm()))
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", "alice.test")
	form.Set("password", "alice password")
	account := b.Get(f.srv.URL+oauth.PathAccount).FormFields(t, "signin-form")
	account.Set("identifier", "alice.test")
	account.Set("password", "alice password")

	f.accounts.mu.Lock()
	f.accounts.busy = true
	f.accounts.mu.Unlock()
	for path, form := range map[string]url.Values{oauth.PathAuthorize: form, oauth.PathAccount: account} {
		p := b.Post(path, form)
		require.Equal(t, http.StatusServiceUnavailable, p.Status, path)
		secs, err := strconv.Atoi(p.Header.Get("Retry-After"))
		require.NoError(t, err, path)
		require.Positive(t, secs)
		require.Contains(t, p.Body, "The server is busy. Try again in a few seconds.", path)
		require.Contains(t, p.Body, `id="signin-form"`, path)
		checkPage(t, p)
	}

	f.accounts.mu.Lock()
	f.accounts.busy = false
	f.accounts.mu.Unlock()
	p = b.Post(oauth.PathAuthorize, form)
	require.Equal(t, http.StatusOK, p.Status)
	require.True(t, strings.Contains(p.Body, `id="consent-form"`))
}

// TestLongScopeToken: a grant whose scope is as long as a request may
// make it yields access tokens that work (the token does not carry the
// scope; its grant does).
func TestLongScopeToken(t *testing.T) {
	t.Parallel()
	f := setup(t)
	scope := "atproto"
	for i := 0; len(scope) < oauth.MaxScopeLen-130; i += 3 {
		scope += fmt.Sprintf(" repo?collection=com.example.collection%03d&collection=com.example.collection%03d&collection=com.example.collection%03d&action=create", i, i+1, i+2)
	}
	c := f.rawClient("long", scope)
	a := c.tokens()
	require.Equal(t, scope, a.str("scope"))
	require.Equal(t, http.StatusOK, c.call(a.str("access_token"), c.key, "check=repo&collection=com.example.collection007&action=create").StatusCode)
	require.Equal(t, http.StatusForbidden, c.call(a.str("access_token"), c.key, "check=repo&collection=com.example.collection007&action=delete").StatusCode)
}
