package pds

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
)

// The mail flows end to end through HTTP: a request, the mail arriving at a
// real SMTP server, the code taken out of the mail, and the method that
// uses it, once.

// userEmail is the address createUser gave u.
func userEmail(u *user) string {
	return strings.TrimSuffix(u.handle, ".test") + "@example.com"
}

// noCodesLogged checks that no log line holds any of codes.
func (e *mailEnv) noCodesLogged(t *testing.T, codes ...string) {
	t.Helper()
	logs := e.logs.String()
	require.NotEmpty(t, logs)
	for _, c := range codes {
		require.NotContains(t, logs, c, "a code is in the log")
	}
}

func TestConfirmEmail(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	addr := userEmail(u)

	sess := e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).json(t)
	require.Equal(t, addr, sess["email"])
	require.Equal(t, false, sess["emailConfirmed"])
	require.Equal(t, false, sess["emailAuthFactor"])

	e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
	m := sink.Next(t)
	require.Equal(t, []string{addr}, m.To)
	mail := emailtest.Parse(t, m)
	require.NotEmpty(t, mail.Subject)
	require.Contains(t, mail.Text, u.handle)
	code := emailtest.Parse(t, m).Code(t)

	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": "other@example.com", "token": code}).
		fails(t, http.StatusBadRequest, "InvalidEmail")
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": addr, "token": "AAAAA-AAAAA"}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": addr}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
	// The code as a person types it back: lower case, no dash.
	typed := strings.ToLower(strings.ReplaceAll(code, "-", ""))
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": strings.ToUpper(addr), "token": typed}).ok(t)
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": addr, "token": code}).
		fails(t, http.StatusBadRequest, "InvalidToken")

	sess = e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).json(t)
	require.Equal(t, true, sess["emailConfirmed"])
	require.Equal(t, false, sess["emailAuthFactor"])
	login := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t).json(t)
	require.Equal(t, true, login["emailConfirmed"])
	refreshed := e.post(t, "com.atproto.server.refreshSession", u.refresh, nil).ok(t).json(t)
	require.Equal(t, addr, refreshed["email"])
	require.Equal(t, true, refreshed["emailConfirmed"])
	info := e.adminQuery(t, "getAccountInfo", url.Values{"did": {u.did.String()}}).ok(t).json(t)
	require.NotEmpty(t, info["emailConfirmedAt"])

	// An ordinary app password's session sees no email fields; a
	// privileged one's does.
	for _, privileged := range []bool{false, true} {
		name := "plain"
		if privileged {
			name = "privileged"
		}
		ap := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": name, "privileged": privileged}).ok(t)
		s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": ap.str(t, "password")}).ok(t)
		for _, got := range []map[string]any{
			s.json(t),
			e.get(t, "com.atproto.server.getSession", s.str(t, "accessJwt"), nil).ok(t).json(t),
			e.post(t, "com.atproto.server.refreshSession", s.str(t, "refreshJwt"), nil).ok(t).json(t),
		} {
			_, has := got["emailConfirmed"]
			require.Equal(t, privileged, has, "%s app password: %v", name, got)
		}
	}
	e.noCodesLogged(t, code)
	sink.None(t)
}

func TestUpdateEmail(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	other := e.createUser(t)

	// Unconfirmed: no code needed, none sent.
	res := e.post(t, "com.atproto.server.requestEmailUpdate", u.access, nil).ok(t).json(t)
	require.Equal(t, map[string]any{"tokenRequired": false}, res)
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "First@Example.com"}).ok(t)
	require.Equal(t, "first@example.com", e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).str(t, "email"))

	// Confirm it.
	e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
	m := sink.Next(t)
	require.Equal(t, []string{"first@example.com"}, m.To)
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": "first@example.com", "token": emailtest.Parse(t, m).Code(t)}).ok(t)

	// Confirmed: a code, mailed to the current address, is required.
	e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
	stale := emailtest.Parse(t, sink.Next(t)).Code(t)
	res = e.post(t, "com.atproto.server.requestEmailUpdate", u.access, nil).ok(t).json(t)
	require.Equal(t, map[string]any{"tokenRequired": true}, res)
	m = sink.Next(t)
	require.Equal(t, []string{"first@example.com"}, m.To)
	code := emailtest.Parse(t, m).Code(t)

	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "second@example.com"}).
		fails(t, http.StatusBadRequest, "TokenRequired")
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "second@example.com", "token": "AAAAA-AAAAA"}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": userEmail(other), "token": code}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "not an address", "token": code}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "second@example.com", "token": code, "emailAuthFactor": true}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "second@example.com", "token": code}).ok(t)

	sess := e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).json(t)
	require.Equal(t, "second@example.com", sess["email"])
	require.Equal(t, false, sess["emailConfirmed"], "a new address is unconfirmed")
	// The code worked once, and the codes mailed to the old address died
	// with it.
	e.post(t, "com.atproto.server.updateEmail", u.access, map[string]any{"email": "third@example.com", "token": code}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": "second@example.com", "token": stale}).
		fails(t, http.StatusBadRequest, "InvalidToken")

	// App passwords may not change the address.
	ap := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "p", "privileged": true}).ok(t)
	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": ap.str(t, "password")}).ok(t)
	e.post(t, "com.atproto.server.requestEmailUpdate", s.str(t, "accessJwt"), nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.updateEmail", s.str(t, "accessJwt"), map[string]any{"email": "x@example.com"}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.noCodesLogged(t, code, stale)
	sink.None(t)
}

func TestAccountDeleteByMail(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	keep := e.createUser(t)

	e.post(t, "com.atproto.server.requestAccountDelete", u.access, nil).ok(t)
	m := sink.Next(t)
	require.Equal(t, []string{userEmail(u)}, m.To)
	code := emailtest.Parse(t, m).Code(t)
	before := e.rowCounts(t)
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": "AAAAA-AAAAA"}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": keep.did, "password": keep.pass, "token": code}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	require.Equal(t, before, e.rowCounts(t), "refused deletions change nothing")

	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": code}).ok(t)
	_, err := e.accounts.Get(context.Background(), u.did)
	require.Error(t, err)
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": code}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.get(t, "com.atproto.server.getSession", keep.access, nil).ok(t)

	// App passwords may not ask for a deletion code.
	ap := e.post(t, "com.atproto.server.createAppPassword", keep.access, map[string]any{"name": "p", "privileged": true}).ok(t)
	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": keep.handle, "password": ap.str(t, "password")}).ok(t)
	e.post(t, "com.atproto.server.requestAccountDelete", s.str(t, "accessJwt"), nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.noCodesLogged(t, code)
	sink.None(t)
}

func TestRequestPlcOperationSignature(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)

	e.post(t, "com.atproto.identity.requestPlcOperationSignature", "", nil).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.post(t, "com.atproto.identity.requestPlcOperationSignature", u.access, nil).ok(t)
	m := sink.Next(t)
	require.Equal(t, []string{userEmail(u)}, m.To)
	code := emailtest.Parse(t, m).Code(t)

	// signPlcOperation uses it up through the account service's Mailer, in
	// its own transaction.
	ctx := context.Background()
	consume := func(c string) error {
		return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			return e.accounts.Mail().Consume(ctx, tx, u.did, email.PurposePLCOperation, c)
		})
	}
	require.ErrorIs(t, consume("AAAAA-AAAAA"), email.ErrTokenInvalid)
	require.NoError(t, consume(code))
	require.ErrorIs(t, consume(code), email.ErrTokenInvalid, "once")
	e.noCodesLogged(t, code)
}

// Codes live 15 minutes: past that, each method that takes one says
// ExpiredToken (the Mailer's clock is moved, not waited for).
func TestEmailCodesExpire(t *testing.T) {
	t.Parallel()
	e := newMailEnv(t, "", false, envOptions{})
	u := e.createUser(t)
	e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
	e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": userEmail(u)}).ok(t)
	e.post(t, "com.atproto.server.requestAccountDelete", u.access, nil).ok(t)
	confirm := e.heldCode(t, u.did, email.PurposeConfirmEmail)
	reset := e.heldCode(t, u.did, email.PurposeResetPassword)
	del := e.heldCode(t, u.did, email.PurposeDeleteAccount)
	require.NotEmpty(t, confirm)
	require.NotEmpty(t, reset)
	require.NotEmpty(t, del)

	e.clock.Advance(email.DefaultTokenTTL + time.Second)
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": userEmail(u), "token": confirm}).
		fails(t, http.StatusBadRequest, "ExpiredToken")
	e.post(t, "com.atproto.server.resetPassword", "", map[string]any{"token": reset, "password": "a new password"}).
		fails(t, http.StatusBadRequest, "ExpiredToken")
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": del}).
		fails(t, http.StatusBadRequest, "ExpiredToken")
	require.Empty(t, e.heldCode(t, u.did, email.PurposeConfirmEmail), "expired codes are not shown to the operator")

	// A new request replaces the code, and the new one works.
	e.post(t, "com.atproto.server.requestAccountDelete", u.access, nil).ok(t)
	del = e.heldCode(t, u.did, email.PurposeDeleteAccount)
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": del}).ok(t)
}

// A mail server that is down fails no request: the mail waits in the
// outbox and goes out, with a working code, once the server is back.
func TestMailServerDownThenUp(t *testing.T) {
	t.Parallel()
	addr := emailtest.FreeAddr(t)
	e := newMailEnv(t, "smtp://"+addr+"?tls=none", false, envOptions{})
	u := e.createUser(t)

	e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
	require.Zero(t, e.deliver(t), "nothing listens: the attempt fails and is scheduled again")
	// Meanwhile the operator can read the code (its mail is not sent).
	require.NotEmpty(t, e.heldCode(t, u.did, email.PurposeConfirmEmail))

	sink := emailtest.StartSMTP(t, emailtest.Options{Addr: addr})
	require.Zero(t, e.deliver(t), "the retry is not due yet")
	sink.None(t)
	e.clock.Advance(email.DefaultRetryBase + time.Second)
	require.Equal(t, 1, e.deliver(t))
	m := sink.Next(t)
	require.Equal(t, []string{userEmail(u)}, m.To)
	require.Empty(t, e.heldCode(t, u.did, email.PurposeConfirmEmail), "sent: no longer readable")
	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": userEmail(u), "token": emailtest.Parse(t, m).Code(t)}).ok(t)
}
