package pds

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// TestOAuthSignInRules: the sign-in page takes the account password only,
// under the createSession rate limit, and not for a taken-down account.
func TestOAuthSignInRules(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{options: func(o *Options) {
		limits, err := ratelimit.NewSet(map[string][]ratelimit.Rule{
			ratelimit.PolicyCreateSession: {{Limit: 4, Window: time.Hour}},
		}, 100)
		require.NoError(t, err)
		o.Limits = limits
	}})
	app := e.app("app", "atproto", "transition:generic")
	u := e.newUser()
	appPass := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "old app"}).ok(t).str(t, "password")

	b := e.browser()
	authURL := e.startFlow(app, u)
	p := b.SignIn(authURL, u.handle, appPass)
	require.Equal(t, http.StatusUnauthorized, p.Status, p.Body)
	require.Contains(t, p.Body, "Wrong handle, email or password")
	p = b.SignIn(authURL, u.handle, "not the password")
	require.Equal(t, http.StatusUnauthorized, p.Status, p.Body)

	// A taken-down account cannot sign in, even with its password.
	down := e.newUser()
	e.adminProc(t, "updateSubjectStatus", takedownBody(down.did.String(), true)).ok(t)
	p = e.browser().SignIn(e.startFlow(app, down), down.handle, down.pass)
	require.Equal(t, http.StatusForbidden, p.Status, p.Body)
	require.Contains(t, p.Body, "cannot be used to sign in")

	// Two attempts used of four for this handle and address: two more,
	// then the limit, even with the right password.
	p = b.SignIn(authURL, u.handle, "wrong again")
	require.Equal(t, http.StatusUnauthorized, p.Status, p.Body)
	p = b.SignIn(authURL, u.handle, u.pass)
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	require.Contains(t, p.Body, `id="consent-form"`)
	p = e.browser().SignIn(e.startFlow(app, u), u.handle, u.pass)
	require.Equal(t, http.StatusTooManyRequests, p.Status, p.Body)
	require.Contains(t, p.Body, "Too many sign-in attempts")
}

func takedownBody(did string, applied bool) map[string]any {
	return map[string]any{
		"subject":  map[string]any{"$type": "com.atproto.admin.defs#repoRef", "did": did},
		"takedown": map[string]any{"applied": applied, "ref": "test"},
	}
}

// TestOAuthAccountChangesEndGrants: a takedown, an administrator's
// password reset and the account's deletion each end its OAuth grants, in
// the transaction that makes the change; the apps' tokens stop working.
func TestOAuthAccountChangesEndGrants(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	app := e.app("app", "atproto", "transition:generic")

	changes := []struct {
		name   string
		change func(u *user)
	}{
		{"takedown", func(u *user) {
			e.adminProc(t, "updateSubjectStatus", takedownBody(u.did.String(), true)).ok(t)
			// Reversing the takedown does not bring the grant back.
			e.adminProc(t, "updateSubjectStatus", takedownBody(u.did.String(), false)).ok(t)
		}},
		{"password reset", func(u *user) {
			e.adminProc(t, "updateAccountPassword", map[string]any{"did": u.did.String(), "password": "a new password"}).ok(t)
		}},
		{"deletion", func(u *user) {
			e.adminProc(t, "deleteAccount", map[string]any{"did": u.did.String()}).ok(t)
		}},
	}
	for _, c := range changes {
		u := e.newUser()
		sess := e.session(app, u)
		e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getSession", nil).ok(t)
		require.Equal(t, 1, e.grantCount(u.did), c.name)
		c.change(u)
		require.Zero(t, e.grantCount(u.did), c.name)
		res := e.rawCall(sess, sess.Data.AccessToken, "")
		require.Equal(t, http.StatusUnauthorized, res.status, "%s: %s", c.name, res.body)
		_, err := sess.RefreshTokens(t.Context())
		require.ErrorContains(t, err, "invalid_grant", c.name)
	}
}

// TestOAuthAccountPage: the person signs in on the connected-apps page,
// sees the app, takes its access back, and the app's token stops working.
func TestOAuthAccountPage(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	app := e.app("listed", "atproto", "repo:app.bsky.feed.post?action=create")
	sess := e.session(app, u)
	e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getSession", nil).ok(t)

	b := e.browser()
	p := b.Get(e.publicURL() + oauth.PathAccount)
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", u.handle)
	form.Set("password", u.pass)
	p = b.Post(oauth.PathAccount, form)
	require.Equal(t, http.StatusSeeOther, p.Status, p.Body)

	p = b.Get(e.publicURL() + p.Header.Get("Location"))
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	require.Contains(t, p.Body, app.Config.ClientID)
	require.Equal(t, 1, strings.Count(p.Body, `<form id="revoke-`), p.Body)
	p = b.Post(oauth.PathAccount, p.FormFields(t, "revoke-0"))
	require.Equal(t, http.StatusSeeOther, p.Status, p.Body)

	p = b.Get(e.publicURL() + p.Header.Get("Location"))
	require.Contains(t, p.Body, `id="notice-message"`)
	require.Contains(t, p.Body, `id="no-grants"`)
	require.Zero(t, e.grantCount(u.did))
	res := e.rawCall(sess, sess.Data.AccessToken, "")
	res.fails(t, http.StatusUnauthorized, oauth.CodeInvalidToken)
}
