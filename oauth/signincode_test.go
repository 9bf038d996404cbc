package oauth_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
)

const aliceCode = "ABCDE-FGH23"

// needsCode turns the email sign-in factor on for alice, with code as the
// one mailed, and returns a function reading how many were mailed.
func (f *fixture) needsCode(code string) func() int {
	f.accounts.mu.Lock()
	defer f.accounts.mu.Unlock()
	ta := f.accounts.byID["alice.test"]
	ta.signInCode = code
	return func() int {
		f.accounts.mu.Lock()
		defer f.accounts.mu.Unlock()
		return ta.mailed
	}
}

// signInStep posts the sign-in form of page p with the given fields.
func signInStep(t *testing.T, b *oauthtest.Browser, path string, p *oauthtest.Page, id, pw, code string) *oauthtest.Page {
	t.Helper()
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", id)
	form.Set("password", pw)
	if code != "" {
		form.Set("code", code)
	}
	return b.Post(path, form)
}

// An account with the email sign-in factor: the right password shows the
// code field (a code mailed, the identifier kept, the password not), and
// only the password with the mailed code signs in; a wrong password, a
// wrong code and a lapsed one each say so and keep the code field.
func TestSignInWithEmailCode(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mailed := f.needsCode(aliceCode)
	c := f.rawClient("code", "atproto")
	b := f.browser()
	p := b.Get(c.authURL(c.parForm()))
	require.NotContains(t, p.Body, `id="code"`, "no code field before the password")

	p = signInStep(t, b, oauth.PathAuthorize, p, "alice.test", "alice password", "")
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	checkPage(t, p)
	require.Contains(t, p.Body, `<input id="code" name="code" type="text" autocomplete="one-time-code"`)
	require.Contains(t, p.Body, "One has been sent to its email address")
	require.Contains(t, p.Body, `value="alice.test"`, "the identifier is kept")
	require.NotContains(t, p.Body, "alice password", "the password is never put back into the page")
	require.Equal(t, 1, mailed())

	for _, tc := range []struct {
		name, pw, code, want string
		status               int
	}{
		{"wrong password", "wrong", aliceCode, "Wrong handle, email or password.", http.StatusUnauthorized},
		{"wrong code", "alice password", "WRONG-CODE2", "That sign-in code is wrong", http.StatusUnauthorized},
		{"too long", "alice password", strings.Repeat("A", 65), "too long", http.StatusBadRequest},
	} {
		q := signInStep(t, b, oauth.PathAuthorize, p, "alice.test", tc.pw, tc.code)
		require.Equal(t, tc.status, q.Status, tc.name)
		checkPage(t, q)
		require.Contains(t, q.Body, tc.want, tc.name)
		require.Contains(t, q.Body, `id="code"`, "%s: the code field stays", tc.name)
		require.NotContains(t, q.Body, "consent-form", tc.name)
	}
	f.accounts.mu.Lock()
	f.accounts.byID["alice.test"].codeExpired = true
	f.accounts.mu.Unlock()
	q := signInStep(t, b, oauth.PathAuthorize, p, "alice.test", "alice password", aliceCode)
	require.Equal(t, http.StatusUnauthorized, q.Status)
	require.Contains(t, q.Body, "That sign-in code has expired")
	f.accounts.mu.Lock()
	f.accounts.byID["alice.test"].codeExpired = false
	f.accounts.mu.Unlock()
	require.Equal(t, 1, mailed(), "only a right password without a code mails")

	// Pasted with spaces around it.
	q = signInStep(t, b, oauth.PathAuthorize, p, "alice.test", "alice password", " "+aliceCode+" ")
	require.Equal(t, http.StatusOK, q.Status, q.Body)
	require.Contains(t, q.Body, "consent-form")
	require.Contains(t, q.Body, "@alice.test")
	params := b.Approve(q)
	require.NotEmpty(t, params.Get("code"))
}

// The connected-apps page signs in the same way.
func TestAccountPageSignInWithEmailCode(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mailed := f.needsCode(aliceCode)
	b := f.browser()
	p := b.Get(f.srv.URL + oauth.PathAccount)
	require.Equal(t, http.StatusOK, p.Status)
	p = signInStep(t, b, oauth.PathAccount, p, "alice.test", "alice password", "")
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	checkPage(t, p)
	require.Contains(t, p.Body, `id="code"`)
	require.NotContains(t, p.Body, "alice password")
	require.Equal(t, 1, mailed())
	q := signInStep(t, b, oauth.PathAccount, p, "alice.test", "alice password", "WRONG-CODE2")
	require.Equal(t, http.StatusUnauthorized, q.Status)
	require.Contains(t, q.Body, `id="code"`)
	q = signInStep(t, b, oauth.PathAccount, p, "alice.test", "alice password", aliceCode)
	require.Equal(t, http.StatusSeeOther, q.Status, q.Body)
	p = b.Get(f.srv.URL + q.Header.Get("Location"))
	require.Contains(t, p.Body, "@alice.test")
}
