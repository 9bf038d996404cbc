package pds

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/oauth"
)

// confirmAndEnableFactor confirms u's address and turns the email sign-in
// factor on, as the Bluesky app does: requestEmailUpdate mails a code,
// updateEmail with the same address, emailAuthFactor and the code.
func confirmAndEnableFactor(t *testing.T, e *mailEnv, sink *emailtest.Server, u *user) {
	t.Helper()
	addr := userEmail(u)
	// Not before the address is confirmed: a code might never arrive.
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": addr, "emailAuthFactor": true}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": addr, "token": emailtest.Parse(t, sink.Next(t)).Code(t)}).ok(t)
	// Confirmed: turning it on (or off) needs the mailed update code, so
	// a stolen session cannot change it.
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": addr, "emailAuthFactor": true}).
		fails(t, http.StatusBadRequest, "TokenRequired")
	e.post(t, "com.atproto.server.requestEmailUpdate", u.access, nil).ok(t)
	code := emailtest.Parse(t, sink.Next(t)).Code(t)
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": addr, "emailAuthFactor": true, "token": code}).ok(t)
	sess := e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).json(t)
	require.Equal(t, true, sess["emailAuthFactor"])
	require.Equal(t, true, sess["emailConfirmed"])
}

// With the email factor on, createSession without the mailed code fails
// with AuthFactorTokenRequired (and mails one), succeeds with it, and the
// code works once, for nothing else, and not forever.
func TestEmailAuthFactor(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	app := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "phone"}).ok(t).str(t, "password")
	confirmAndEnableFactor(t, e, sink, u)
	const create = "com.atproto.server.createSession"
	login := map[string]any{"identifier": u.handle, "password": u.pass}

	// A wrong password sends nothing.
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": "wrong password"}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	sink.None(t)

	msg := e.post(t, create, "", login).fails(t, http.StatusUnauthorized, "AuthFactorTokenRequired")
	require.Contains(t, msg, "sign in code")
	m := emailtest.Parse(t, sink.Next(t))
	require.Contains(t, m.Subject, "sign-in code")
	code := m.Code(t)

	// Logins retried at once do not flood the mailbox: the live code
	// stays, no new mail.
	e.post(t, create, "", login).fails(t, http.StatusUnauthorized, "AuthFactorTokenRequired")
	e.post(t, create, "", login).fails(t, http.StatusUnauthorized, "AuthFactorTokenRequired")
	sink.None(t)

	// The code is for signing in only; other codes do not sign in.
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": userEmail(u), "token": code}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.requestEmailUpdate", u.access, nil).ok(t)
	update := emailtest.Parse(t, sink.Next(t)).Code(t)
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "authFactorToken": update}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	// ... nor with the right code and a wrong password.
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": "wrong password", "authFactorToken": code}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")

	sess := e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "authFactorToken": code}).ok(t).json(t)
	require.Equal(t, true, sess["emailAuthFactor"])
	e.get(t, "com.atproto.server.getSession", sess["accessJwt"].(string), nil).ok(t)
	// Once.
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "authFactorToken": code}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	// The update code was not used up by the failed sign-in.
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": userEmail(u), "token": update}).ok(t)

	// App passwords are not subject to the factor.
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": app}).ok(t)
	sink.None(t)

	// A lapsed code: ExpiredToken, and a new login mails a new one.
	e.post(t, create, "", login).fails(t, http.StatusUnauthorized, "AuthFactorTokenRequired")
	late := emailtest.Parse(t, sink.Next(t)).Code(t)
	e.clock.Advance(email.DefaultTokenTTL + 1)
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "authFactorToken": late}).
		fails(t, http.StatusBadRequest, "ExpiredToken")
	e.post(t, create, "", login).fails(t, http.StatusUnauthorized, "AuthFactorTokenRequired")
	require.NotEqual(t, late, emailtest.Parse(t, sink.Next(t)).Code(t))
	e.noCodesLogged(t, code, late)

	// Turning it off needs the update code too.
	e.post(t, "com.atproto.server.requestEmailUpdate", u.access, nil).ok(t)
	off := emailtest.Parse(t, sink.Next(t)).Code(t)
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": userEmail(u), "emailAuthFactor": false, "token": off}).ok(t)
	e.post(t, create, "", login).ok(t)
	sink.None(t)
}

// Guessing is bounded: after account.MaxSignInCodeFailures wrong codes the
// live one is void, even the right one, until a new login mails another.
func TestEmailAuthFactorGuessing(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	confirmAndEnableFactor(t, e, sink, u)
	const create = "com.atproto.server.createSession"
	login := map[string]any{"identifier": u.handle, "password": u.pass}
	e.post(t, create, "", login).fails(t, http.StatusUnauthorized, "AuthFactorTokenRequired")
	code := emailtest.Parse(t, sink.Next(t)).Code(t)
	for i := 0; i < account.MaxSignInCodeFailures; i++ {
		e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "authFactorToken": "AAAAA-AAAA" + string(rune('A'+i))}).
			fails(t, http.StatusBadRequest, "InvalidToken")
	}
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "authFactorToken": code}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	// Its mail would not be sent any more either; a new login mails a new
	// code at once (the void one no longer holds the resend back).
	e.post(t, create, "", login).fails(t, http.StatusUnauthorized, "AuthFactorTokenRequired")
	fresh := emailtest.Parse(t, sink.Next(t)).Code(t)
	require.NotEqual(t, code, fresh)
	e.post(t, create, "", map[string]any{"identifier": u.handle, "password": u.pass, "authFactorToken": fresh}).ok(t)
}

// A new address turns the factor off (codes would go to an address not
// confirmed yet), and it cannot be turned on with the change.
func TestEmailAuthFactorNewAddress(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	confirmAndEnableFactor(t, e, sink, u)
	e.post(t, "com.atproto.server.requestEmailUpdate", u.access, nil).ok(t)
	code := emailtest.Parse(t, sink.Next(t)).Code(t)
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "elsewhere@example.com", "emailAuthFactor": true, "token": code}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "elsewhere@example.com", "token": code}).ok(t)
	sess := e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).json(t)
	require.Equal(t, false, sess["emailAuthFactor"])
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t)
	sink.None(t)
}

// The OAuth sign-in pages' Login takes the account password and, for an
// account with the factor on, the mailed code, through the same step as
// createSession: a wrong password mails nothing, the right one without a
// code mails one, and the code is checked as createSession checks it.
func TestEmailAuthFactorOAuthLogin(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	accts := &oauthAccounts{s: e.server}
	ctx := t.Context()
	_, err := accts.Login(ctx, u.handle, u.pass, "")
	require.NoError(t, err, "no factor: the password is enough")

	confirmAndEnableFactor(t, e, sink, u)
	_, err = accts.Login(ctx, u.handle, "wrong password", "")
	require.ErrorIs(t, err, oauth.ErrLoginFailed)
	_, err = accts.Login(ctx, u.handle, "wrong password", "AAAAA-AAAAA")
	require.ErrorIs(t, err, oauth.ErrLoginFailed)
	sink.None(t)

	_, err = accts.Login(ctx, u.handle, u.pass, "")
	require.ErrorIs(t, err, oauth.ErrCodeRequired)
	require.ErrorIs(t, err, account.ErrAuthFactorTokenRequired)
	code := emailtest.Parse(t, sink.Next(t)).Code(t)
	_, err = accts.Login(ctx, u.handle, u.pass, "AAAAA-AAAAA")
	require.ErrorIs(t, err, oauth.ErrCodeInvalid)
	a, err := accts.Login(ctx, u.handle, u.pass, code)
	require.NoError(t, err)
	require.Equal(t, u.did, a.DID)
	_, err = accts.Login(ctx, u.handle, u.pass, code)
	require.ErrorIs(t, err, oauth.ErrCodeInvalid, "once")

	_, err = accts.Login(ctx, u.handle, u.pass, "")
	require.ErrorIs(t, err, oauth.ErrCodeRequired)
	late := emailtest.Parse(t, sink.Next(t)).Code(t)
	e.clock.Advance(email.DefaultTokenTTL + 1)
	_, err = accts.Login(ctx, u.handle, u.pass, late)
	require.ErrorIs(t, err, oauth.ErrCodeExpired)
}
