package pds

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/internal/testclock"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// newOAuthMailEnv is an oauthEnv whose Mailer sends to the SMTP server at
// smtpURL on a hand-moved clock, its worker running as serve runs it; the
// mailEnv view of it is for the mail helpers.
func newOAuthMailEnv(t *testing.T, smtpURL string) (*oauthEnv, *mailEnv) {
	t.Helper()
	clock := testclock.New(time.Now())
	logs := &lockedBuffer{}
	sc, err := email.ParseSMTPURL(smtpURL)
	require.NoError(t, err)
	cfg := &email.Config{From: "Bulwark <noreply@pds.test>", Now: clock.Now, SendTimeout: 10 * time.Second, SMTP: sc}
	e := newOAuthEnv(t, oauthEnvOptions{env: func(eo *envOptions) { eo.mail, eo.logs = cfg, logs }})
	m := e.accounts.Mail()
	require.NoError(t, m.Start(context.Background()))
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	return e, &mailEnv{accountEnv: e.accountEnv, clock: clock, logs: logs}
}

// codeStep submits the sign-in form on page p.
func codeStep(t *testing.T, b *oauthtest.Browser, p *oauthtest.Page, id, pw, code string) *oauthtest.Page {
	t.Helper()
	form := p.FormFields(t, "signin-form")
	form.Set("identifier", id)
	form.Set("password", pw)
	form.Set("code", code)
	return b.Post(oauth.PathAuthorize, form)
}

// An account with email sign-in codes on signs in to an app on the OAuth
// pages as with createSession: the right password mails a code (a wrong
// one mails nothing) and shows the code field; the password with the
// mailed code signs in, once; a wrong code and a lapsed one say so.
func TestOAuthSignInWithEmailCode(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e, me := newOAuthMailEnv(t, sink.URL())
	u := e.newUser()
	confirmAndEnableFactor(t, me, sink, u)
	app := e.app("code-app", "atproto", "transition:generic")
	b := e.browser()
	authURL := e.startFlow(app, u)

	p := b.SignIn(authURL, u.handle, "wrong password")
	require.Equal(t, http.StatusUnauthorized, p.Status, p.Body)
	sink.None(t)
	p = b.SignIn(authURL, u.handle, u.pass)
	require.Equal(t, http.StatusOK, p.Status, p.Body)
	require.Contains(t, p.Body, `id="code"`, "the page asks for the code")
	require.NotContains(t, p.Body, "consent-form")
	require.NotContains(t, p.Body, u.pass)
	m := emailtest.Parse(t, sink.Next(t))
	require.Contains(t, m.Subject, "sign-in code")
	code := m.Code(t)

	p2 := codeStep(t, b, p, u.handle, u.pass, "AAAAA-AAAAA")
	require.Equal(t, http.StatusUnauthorized, p2.Status)
	require.Contains(t, p2.Body, "That sign-in code is wrong")
	p2 = codeStep(t, b, p, u.handle, "wrong password", code)
	require.Equal(t, http.StatusUnauthorized, p2.Status)
	require.Contains(t, p2.Body, "Wrong handle, email or password.")

	consent := codeStep(t, b, p, u.handle, u.pass, code)
	require.Equal(t, http.StatusOK, consent.Status, consent.Body)
	params := b.Approve(consent)
	data, err := app.ProcessCallback(context.Background(), params)
	require.NoError(t, err)
	require.Equal(t, u.did, data.AccountDID)
	sess, err := app.ResumeSession(context.Background(), data.AccountDID, data.SessionID)
	require.NoError(t, err)
	res := e.xrpcCall(sess, http.MethodGet, "com.atproto.server.getSession", nil)
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	sink.None(t)

	// Another app, another browser: the used code does not sign in again,
	// and a code left to lapse says so.
	b = e.browser()
	p = b.SignIn(e.startFlow(e.app("code-app-2", "atproto"), u), u.handle, u.pass)
	require.Contains(t, p.Body, `id="code"`)
	p2 = codeStep(t, b, p, u.handle, u.pass, code)
	require.Equal(t, http.StatusUnauthorized, p2.Status)
	late := emailtest.Parse(t, sink.Next(t)).Code(t)
	me.clock.Advance(email.DefaultTokenTTL + 1)
	p2 = codeStep(t, b, p, u.handle, u.pass, late)
	require.Equal(t, http.StatusUnauthorized, p2.Status)
	require.Contains(t, p2.Body, "That sign-in code has expired")
	require.False(t, strings.Contains(me.logs.String(), code) || strings.Contains(me.logs.String(), late), "no code in the log")
}

// A sign-in code the address's mail limit refuses: the OAuth sign-in
// says to wait (oauth.ErrRateLimited, the page's 429), as createSession
// answers RateLimitExceeded, and no code is issued or mailed.
func TestOAuthSignInCodeMailLimited(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newLimitedMailEnv(t, sink)
	u := e.createUser(t)
	addr := userEmail(u)
	nextCode := func() string {
		t.Helper()
		require.Equal(t, 1, e.deliver(t))
		return emailtest.Parse(t, sink.Next(t)).Code(t)
	}
	// The address's limit, spent on confirmation codes and the code that
	// turns the factor on.
	limit := ratelimit.DefaultPolicies()[ratelimit.PolicyMailRecipient][0].Limit
	var code string
	for range limit - 1 {
		e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
		code = nextCode()
	}
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": addr, "token": code}).ok(t)
	e.post(t, "com.atproto.server.requestEmailUpdate", u.access, nil).ok(t)
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": addr, "emailAuthFactor": true, "token": nextCode()}).ok(t)

	_, err := (&oauthAccounts{s: e.server}).Login(t.Context(), u.handle, u.pass, "")
	require.ErrorIs(t, err, oauth.ErrRateLimited)
	require.ErrorIs(t, err, email.ErrRecipientLimited)
	require.Zero(t, e.deliver(t))
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).
		fails(t, http.StatusTooManyRequests, "RateLimitExceeded")
}
