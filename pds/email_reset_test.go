package pds

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
)

// Password resets by mail, and what every password change revokes.

// credentials are a user's ways in besides the password: a second
// session and a privileged app password.
type credentials struct {
	access, refresh string
	appPassword     string
	appAccess       string
	appRefresh      string
}

func (e *accountEnv) moreCredentials(t *testing.T, u *user) credentials {
	t.Helper()
	var c credentials
	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t)
	c.access, c.refresh = s.str(t, "accessJwt"), s.str(t, "refreshJwt")
	ap := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "phone", "privileged": true}).ok(t)
	c.appPassword = ap.str(t, "password")
	s = e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": c.appPassword}).ok(t)
	c.appAccess, c.appRefresh = s.str(t, "accessJwt"), s.str(t, "refreshJwt")
	return c
}

// requireRevoked checks that u's old password and every credential in c
// (and u's own session) stopped working, and that newPass works.
func (e *accountEnv) requireRevoked(t *testing.T, u *user, c credentials, newPass string) {
	t.Helper()
	for _, pw := range []string{u.pass, c.appPassword} {
		e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": pw}).
			fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	}
	for _, refresh := range []string{u.refresh, c.refresh, c.appRefresh} {
		e.post(t, "com.atproto.server.refreshSession", refresh, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	}
	for _, access := range []string{u.access, c.access, c.appAccess} {
		e.get(t, "com.atproto.server.getSession", access, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	}
	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": newPass}).ok(t)
	l := e.get(t, "com.atproto.server.listAppPasswords", s.str(t, "accessJwt"), nil).ok(t)
	require.JSONEq(t, `{"passwords":[]}`, string(l.body))
}

// An administrator's reset (admin.updateAccountPassword) ends every way in
// the old password gave: an app password made before it, privileged
// even, no longer logs in, and no session's refresh token is accepted.
func TestAdminPasswordResetRevokesEverything(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	bystander := e.createUser(t)
	c := e.moreCredentials(t, u)
	other := e.moreCredentials(t, bystander)

	e.adminProc(t, "updateAccountPassword", map[string]any{"did": u.did, "password": "the admin's new one"}).ok(t)
	e.requireRevoked(t, u, c, "the admin's new one")

	// Another account keeps everything.
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": bystander.handle, "password": other.appPassword}).ok(t)
	e.post(t, "com.atproto.server.refreshSession", other.refresh, nil).ok(t)
}

func TestResetPasswordByMail(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	c := e.moreCredentials(t, u)

	e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": " " + strings.ToUpper(userEmail(u)) + " "}).ok(t)
	m := sink.Next(t)
	require.Equal(t, []string{userEmail(u)}, m.To)
	code := emailtest.Parse(t, m).Code(t)

	e.post(t, "com.atproto.server.resetPassword", "", map[string]any{"token": "AAAAA-AAAAA", "password": "a brand new password"}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	// A password the rules refuse leaves the code usable.
	e.post(t, "com.atproto.server.resetPassword", "", map[string]any{"token": code, "password": "short"}).
		fails(t, http.StatusBadRequest, "InvalidPassword")
	e.post(t, "com.atproto.server.resetPassword", "", map[string]any{"token": code}).
		fails(t, http.StatusBadRequest, "InvalidPassword")
	e.post(t, "com.atproto.server.resetPassword", "", map[string]any{"password": "a brand new password"}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.resetPassword", "", map[string]any{"token": code, "password": "a brand new password"}).ok(t)
	e.post(t, "com.atproto.server.resetPassword", "", map[string]any{"token": code, "password": "yet another password"}).
		fails(t, http.StatusBadRequest, "InvalidToken")

	e.requireRevoked(t, u, c, "a brand new password")
	e.noCodesLogged(t, code)
	sink.None(t)
}

// requestPasswordReset answers an address nobody has exactly as one an
// account has (and mails nothing), so that it cannot be used to learn who
// has an account here.
func TestRequestPasswordResetNoEnumeration(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)

	unknown := e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": "nobody@example.com"})
	known := e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": userEmail(u)})
	require.Equal(t, http.StatusOK, known.status)
	require.Equal(t, known.status, unknown.status)
	require.Equal(t, known.body, unknown.body)
	strip := func(h http.Header) http.Header {
		h = h.Clone()
		h.Del("Date")
		h.Del("X-Request-Id")
		return h
	}
	require.Equal(t, strip(known.header), strip(unknown.header))
	// Only the account's mail went out.
	require.Equal(t, []string{userEmail(u)}, sink.Next(t).To)
	sink.None(t)

	// Malformed input is refused whoever asks about it.
	e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": ""}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": "no at sign"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.post(t, "com.atproto.server.requestPasswordReset", "", map[string]any{"email": strings.Repeat("a", 300) + "@example.com"}).
		fails(t, http.StatusBadRequest, "InvalidRequest")
}

// The mail methods' rate limits, as the reference PDS's: a code request
// 5 an hour per account, requestPasswordReset 15 an hour per address;
// resetPassword and deleteAccount keep theirs (set low here to reach).
func TestEmailRateLimits(t *testing.T) {
	t.Parallel()
	e := limitedEnv(t, map[string]string{"resetPassword": "2/5m", "deleteAccount": "2/5m"})
	u := e.createUser(t)
	for _, nsid := range []string{
		"com.atproto.server.requestEmailConfirmation", "com.atproto.server.requestEmailUpdate",
		"com.atproto.server.requestAccountDelete", "com.atproto.identity.requestPlcOperationSignature",
	} {
		for range 5 {
			e.postFrom(t, "198.51.100.1", nsid, u.access, nil).ok(t)
		}
		// Per account: from another address too.
		requireRefusal(t, e.postFrom(t, "198.51.100.2", nsid, u.access, nil), 5)
	}
	other := e.createUser(t)
	e.postFrom(t, "198.51.100.1", "com.atproto.server.requestEmailConfirmation", other.access, nil).ok(t)

	for i := range 15 {
		e.postFrom(t, "198.51.100.3", "com.atproto.server.requestPasswordReset", "", map[string]any{"email": "x" + itoa(i) + "@example.com"}).ok(t)
	}
	requireRefusal(t, e.postFrom(t, "198.51.100.3", "com.atproto.server.requestPasswordReset", "", map[string]any{"email": userEmail(u)}), 15)
	e.postFrom(t, "198.51.100.4", "com.atproto.server.requestPasswordReset", "", map[string]any{"email": userEmail(u)}).ok(t)

	for range 2 {
		e.postFrom(t, "198.51.100.5", "com.atproto.server.resetPassword", "", map[string]any{"token": "AAAAA-AAAAA", "password": "a new password"}).
			fails(t, http.StatusBadRequest, "InvalidToken")
		e.postFrom(t, "198.51.100.5", "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": "wrong", "token": "AAAAA-AAAAA"}).
			fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	}
	requireRefusal(t, e.postFrom(t, "198.51.100.5", "com.atproto.server.resetPassword", "", map[string]any{"token": "AAAAA-AAAAA", "password": "a new password"}), 2)
	requireRefusal(t, e.postFrom(t, "198.51.100.5", "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": "x"}), 2)
}

// Without SMTP the server works: mail is held, describeServer says so, and
// the operator reads the codes with the admin password.
func TestHeldMailAndPendingTokens(t *testing.T) {
	t.Parallel()
	e := newMailEnv(t, "", true, envOptions{})
	u := e.createUser(t)
	d := e.get(t, "com.atproto.server.describeServer", "", nil).ok(t).json(t)
	require.Equal(t, false, d["emailAvailable"])
	require.EqualValues(t, e.cfg.BlobMaxBytes, d["blobUploadLimit"])

	e.post(t, "com.atproto.server.requestEmailConfirmation", u.access, nil).ok(t)
	e.post(t, "com.atproto.identity.requestPlcOperationSignature", u.access, nil).ok(t)

	q := url.Values{"account": {u.handle}}
	nsid := AdminNSIDPrefix + "getPendingEmailTokens"
	e.get(t, nsid, "", q).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.get(t, nsid, u.access, q).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	res := e.adminGet(t, "getPendingEmailTokens", q).ok(t).json(t)
	require.Equal(t, u.did.String(), res["did"])
	require.Equal(t, false, res["mailEnabled"])
	tokens := res["tokens"].([]any)
	require.Len(t, tokens, 2)
	first := tokens[0].(map[string]any)
	require.Equal(t, string(email.PurposeConfirmEmail), first["purpose"])
	require.Equal(t, string(email.PurposePLCOperation), tokens[1].(map[string]any)["purpose"])
	require.NotEmpty(t, first["expiresAt"])
	code := first["code"].(string)
	byDID := e.adminGet(t, "getPendingEmailTokens", url.Values{"account": {u.did.String()}}).ok(t).json(t)
	require.Equal(t, res["tokens"], byDID["tokens"])

	e.post(t, "com.atproto.server.confirmEmail", u.access, map[string]any{"email": userEmail(u), "token": code}).ok(t)
	res = e.adminGet(t, "getPendingEmailTokens", q).ok(t).json(t)
	require.Len(t, res["tokens"].([]any), 1, "a used code is gone")

	e.adminGet(t, "getPendingEmailTokens", url.Values{"account": {"nobody.test"}}).fails(t, http.StatusBadRequest, "NotFound")
	e.adminGet(t, "getPendingEmailTokens", url.Values{"account": {"not a handle"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	e.adminGet(t, "getPendingEmailTokens", nil).fails(t, http.StatusBadRequest, "InvalidRequest")

	// Each read is audited, without the codes.
	audit := e.adminGet(t, "listAuditLog", url.Values{"subject": {u.did.String()}}).ok(t)
	require.Contains(t, string(audit.body), auditReadPendingTokens)
	require.NotContains(t, string(audit.body), code)
	e.noCodesLogged(t, code)
}

func TestDescribeServerWithMail(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), false, envOptions{})
	d := e.get(t, "com.atproto.server.describeServer", "", nil).ok(t).json(t)
	require.Equal(t, true, d["emailAvailable"])
}

func TestAdminSendEmail(t *testing.T) {
	t.Parallel()
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	e := newMailEnv(t, sink.URL(), true, envOptions{})
	u := e.createUser(t)
	in := map[string]any{"recipientDid": u.did, "senderDid": "did:plc:moderator", "subject": "About your account",
		"content": "Hello from the administrator.", "comment": "ticket 12"}

	e.post(t, "com.atproto.admin.sendEmail", u.access, in).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	res := e.adminProc(t, "sendEmail", in).ok(t).json(t)
	require.Equal(t, map[string]any{"sent": true}, res)
	m := sink.Next(t)
	require.Equal(t, []string{userEmail(u)}, m.To)
	mail := emailtest.Parse(t, m)
	require.Contains(t, mail.Subject, "About your account")
	require.Contains(t, mail.Text, "Hello from the administrator.")

	bad := func(change map[string]any) xrpcResult {
		body := map[string]any{}
		for k, v := range in {
			body[k] = v
		}
		for k, v := range change {
			body[k] = v
		}
		return e.adminProc(t, "sendEmail", body)
	}
	bad(map[string]any{"recipientDid": "did:plc:nobodynobodynobody"}).fails(t, http.StatusBadRequest, "NotFound")
	bad(map[string]any{"recipientDid": "nope"}).fails(t, http.StatusBadRequest, "InvalidRequest")
	bad(map[string]any{"senderDid": ""}).fails(t, http.StatusBadRequest, "InvalidRequest")
	bad(map[string]any{"content": " "}).fails(t, http.StatusBadRequest, "InvalidRequest")
	bad(map[string]any{"content": strings.Repeat("x", email.MaxAdminContentLen+1)}).fails(t, http.StatusBadRequest, "InvalidRequest")
	bad(map[string]any{"subject": strings.Repeat("x", email.MaxAdminSubjectLen+1)}).fails(t, http.StatusBadRequest, "InvalidRequest")
	sink.None(t)

	audit := e.adminGet(t, "listAuditLog", url.Values{"subject": {u.did.String()}}).ok(t)
	require.Contains(t, string(audit.body), "com.atproto.admin.sendEmail")
	require.Contains(t, string(audit.body), "ticket 12")
	_, err := e.accounts.Get(context.Background(), u.did)
	require.NoError(t, err)
}
