package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/email"
)

func TestAccountsAndSessions(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	ctx := context.Background()
	u := e.createUser(t)

	t.Run("DID document in the PLC directory points here with the account key", func(t *testing.T) {
		log := e.plc.Log(u.did.String())
		require.Len(t, log, 1)
		op := log[0].Operation.Regular
		require.NotNil(t, op)
		require.Equal(t, []string{"at://" + u.handle}, op.AlsoKnownAs)
		require.Equal(t, e.cfg.PublicURL(), op.Services["atproto_pds"].Endpoint)
		pub, err := e.accounts.PublicKey(ctx, u.did)
		require.NoError(t, err)
		require.Equal(t, pub.DIDKey(), op.VerificationMethods["atproto"])
		require.Equal(t, []string{e.accounts.RotationKey()}, op.RotationKeys)

		// And over HTTP, as any resolver reads it.
		cl := didplc.Client{DirectoryURL: e.plcURL}
		doc, err := cl.Resolve(ctx, u.did.String())
		require.NoError(t, err)
		require.Equal(t, e.cfg.PublicURL(), doc.Service[0].ServiceEndpoint)
		require.Equal(t, pub.Multibase(), doc.VerificationMethod[0].PublicKeyMultibase)
	})

	t.Run("account creation wrote genesis commit and events atomically", func(t *testing.T) {
		require.Equal(t, []string{"identity", "account", "sync"}, e.eventKinds(t, u.did))
		head, err := e.engine.GetHead(ctx, u.did)
		require.NoError(t, err)
		require.NotEmpty(t, head.Rev)
	})

	t.Run("createSession by handle, email and DID", func(t *testing.T) {
		for _, id := range []string{u.handle, strings.ToUpper(u.handle), u.did.String()} {
			res := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": id, "password": u.pass}).ok(t)
			require.Equal(t, u.did.String(), res.str(t, "did"))
			require.Equal(t, true, res.json(t)["active"])
		}
	})

	t.Run("getSession", func(t *testing.T) {
		res := e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t)
		require.Equal(t, u.handle, res.str(t, "handle"))
		require.NotEmpty(t, res.str(t, "email"))
	})

	t.Run("token shapes", func(t *testing.T) {
		p := jwt.NewParser()
		var c jwt.MapClaims
		tok, _, err := p.ParseUnverified(u.access, &c)
		require.NoError(t, err)
		require.Equal(t, "at+jwt", tok.Header["typ"])
		require.Equal(t, "HS256", tok.Header["alg"])
		require.Equal(t, "com.atproto.access", c["scope"])
		require.Equal(t, e.cfg.ServiceDID(), c["aud"])
		exp, _ := c.GetExpirationTime()
		require.WithinDuration(t, time.Now().Add(2*time.Hour), exp.Time, time.Minute)
		c = jwt.MapClaims{}
		tok, _, err = p.ParseUnverified(u.refresh, &c)
		require.NoError(t, err)
		require.Equal(t, "refresh+jwt", tok.Header["typ"])
		require.Equal(t, "com.atproto.refresh", c["scope"])
		require.NotEmpty(t, c["jti"])
	})

	t.Run("refresh rotates; deleteSession ends the session", func(t *testing.T) { refreshAndEndSession(t, e, u) })
	t.Run("bad credentials and tokens", func(t *testing.T) { badCredentials(t, e, u) })
}

// refreshAndEndSession: refreshSession rotates the refresh token (the old
// one yields the same successor within its grace period), and
// deleteSession ends the session for reads and writes alike, leaving the
// account's other sessions alone.
func refreshAndEndSession(t *testing.T, e *accountEnv, u *user) {
	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t)
	access, refresh := s.str(t, "accessJwt"), s.str(t, "refreshJwt")
	r := e.post(t, "com.atproto.server.refreshSession", refresh, nil).ok(t)
	access2, refresh2 := r.str(t, "accessJwt"), r.str(t, "refreshJwt")
	require.NotEqual(t, refresh, refresh2)
	// Presented again within the grace period, the old refresh token
	// yields the same successor (retries, goat); nothing else.
	again := e.post(t, "com.atproto.server.refreshSession", refresh, nil).ok(t)
	require.Equal(t, jti(t, refresh2), jti(t, again.str(t, "refreshJwt")))
	// An access token is not a refresh token, and the reverse.
	e.post(t, "com.atproto.server.refreshSession", access2, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.get(t, "com.atproto.server.getSession", refresh2, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	// Both access tokens of the session work until it ends.
	e.get(t, "com.atproto.server.getSession", access, nil).ok(t)
	e.get(t, "com.atproto.server.getSession", access2, nil).ok(t)
	e.post(t, "com.atproto.repo.createRecord", access2, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "beforeend", "record": post("ok")}).ok(t)
	e.post(t, "com.atproto.server.deleteSession", refresh2, nil).ok(t)
	e.get(t, "com.atproto.server.getSession", access2, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	// Writes check the session inside the commit's transaction (the
	// guard of requireRepoWrite): refused with the same error, and
	// nothing is stored.
	e.post(t, "com.atproto.repo.createRecord", access2, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "afterend", "record": post("no")}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.repo.applyWrites", access2, map[string]any{"repo": u.did, "writes": []any{map[string]any{
		"$type": "com.atproto.repo.applyWrites#create", "collection": "app.bsky.feed.post", "rkey": "afterend", "value": post("no")}}}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.repo.deleteRecord", access2, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "rkey": "beforeend"}).
		fails(t, http.StatusBadRequest, "InvalidToken")
	e.get(t, "com.atproto.repo.getRecord", "", url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {"afterend"}}).
		fails(t, http.StatusBadRequest, "RecordNotFound")
	e.get(t, "com.atproto.repo.getRecord", "", url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {"beforeend"}}).ok(t)
	e.post(t, "com.atproto.server.refreshSession", refresh2, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.post(t, "com.atproto.server.refreshSession", refresh, nil).fails(t, http.StatusBadRequest, "InvalidToken")
	// deleteSession is idempotent.
	e.post(t, "com.atproto.server.deleteSession", refresh2, nil).ok(t)
	// Other sessions are unaffected.
	e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t)
}

// badCredentials: wrong passwords, tokens of the wrong kind, expired,
// forged or foreign tokens are refused with the names clients act on.
func badCredentials(t *testing.T, e *accountEnv, u *user) {
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": "wrong password"}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": "nobody.test", "password": "whatever12"}).
		fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	e.get(t, "com.atproto.server.getSession", "", nil).fails(t, http.StatusUnauthorized, "AuthenticationRequired")

	sign := func(secret []byte, typ string, claims jwt.MapClaims) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
		tok.Header["typ"] = typ
		s, err := tok.SignedString(secret)
		require.NoError(t, err)
		return s
	}
	now := time.Now()
	base := func() jwt.MapClaims {
		return jwt.MapClaims{"scope": "com.atproto.access", "sub": u.did.String(), "aud": e.cfg.ServiceDID(),
			"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "jti": "x"}
	}
	expired := base()
	expired["exp"] = now.Add(-time.Minute).Unix()
	e.get(t, "com.atproto.server.getSession", sign(e.jwt, "at+jwt", expired), nil).fails(t, http.StatusBadRequest, "ExpiredToken")
	e.get(t, "com.atproto.server.getSession", sign([]byte(strings.Repeat("f", 40)), "at+jwt", base()), nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.get(t, "com.atproto.server.getSession", sign(e.jwt, "refresh+jwt", base()), nil).fails(t, http.StatusBadRequest, "InvalidToken")
	otherAud := base()
	otherAud["aud"] = "did:web:elsewhere.example"
	e.get(t, "com.atproto.server.getSession", sign(e.jwt, "at+jwt", otherAud), nil).fails(t, http.StatusBadRequest, "InvalidToken")
	serviceAuth := base()
	serviceAuth["lxm"] = "com.atproto.server.getSession"
	e.get(t, "com.atproto.server.getSession", sign(e.jwt, "at+jwt", serviceAuth), nil).fails(t, http.StatusBadRequest, "InvalidToken")
	// Correctly signed, but not a session this server started.
	e.get(t, "com.atproto.server.getSession", sign(e.jwt, "at+jwt", base()), nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.get(t, "com.atproto.server.getSession", "not-a-jwt", nil).fails(t, http.StatusBadRequest, "InvalidToken")
	e.do(t, http.MethodGet, "com.atproto.server.getSession", "", nil, nil, http.Header{"Authorization": {"Basic abc"}}).
		fails(t, http.StatusBadRequest, "InvalidToken")
}

func TestCreateAccountRefusals(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	before := e.rowCounts(t)
	plcBefore := e.plc.Count()

	cases := []struct {
		name   string
		in     map[string]any
		status int
		error  string
	}{
		{"duplicate handle", map[string]any{"handle": u.handle, "email": "dup@example.com", "password": "long enough"}, 400, "HandleNotAvailable"},
		{"duplicate handle other case", map[string]any{"handle": strings.ToUpper(u.handle), "email": "dup@example.com", "password": "long enough"}, 400, "HandleNotAvailable"},
		{"outside the domains", map[string]any{"handle": "alice.example.com", "email": "a@example.com", "password": "long enough"}, 400, "UnsupportedDomain"},
		{"reserved", map[string]any{"handle": "admin.test", "email": "a@example.com", "password": "long enough"}, 400, "HandleNotAvailable"},
		{"too short", map[string]any{"handle": "ab.test", "email": "a@example.com", "password": "long enough"}, 400, "InvalidHandle"},
		{"malformed", map[string]any{"handle": "-bad-.test", "email": "a@example.com", "password": "long enough"}, 400, "InvalidHandle"},
		{"weak password", map[string]any{"handle": "alice.test", "email": "a@example.com", "password": "short"}, 400, "InvalidPassword"},
		{"no password", map[string]any{"handle": "alice.test", "email": "a@example.com"}, 400, "InvalidPassword"},
		{"bad email", map[string]any{"handle": "alice.test", "email": "not an email", "password": "long enough"}, 400, "InvalidRequest"},
		{"email taken", map[string]any{"handle": "alice.test", "email": "user" + strings.TrimSuffix(strings.TrimPrefix(u.handle, "user"), ".test") + "@example.com", "password": "long enough"}, 400, "InvalidRequest"},
		{"existing DID without a service-auth JWT", map[string]any{"handle": "alice.test", "email": "a@example.com", "password": "long enough", "did": "did:web:example.com"}, 401, "AuthenticationRequired"},
		{"plcOp", map[string]any{"handle": "alice.test", "email": "a@example.com", "password": "long enough", "plcOp": map[string]any{}}, 400, "IncompatibleDidDoc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e.post(t, "com.atproto.server.createAccount", "", tc.in).fails(t, tc.status, tc.error)
		})
	}
	require.Equal(t, before, e.rowCounts(t), "a refused createAccount changes nothing")
	require.Equal(t, plcBefore, e.plc.Count(), "nor the PLC directory")
}

func TestCreateAccountPLCFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	fail := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"message":"directory unavailable"}`, http.StatusServiceUnavailable)
	})
	e := newAccountEnv(t, envOptions{plcHandler: fail})
	before := e.rowCounts(t)
	e.post(t, "com.atproto.server.createAccount", "", map[string]any{
		"handle": "alice.test", "email": "alice@example.com", "password": "long enough",
	}).fails(t, http.StatusBadGateway, "UpstreamFailure")
	require.Equal(t, before, e.rowCounts(t))
}

func TestInviteCodes(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{configure: func(c *config.Config) { c.InviteRequired = true }})
	in := func(code string) map[string]any {
		return map[string]any{"handle": "invited" + itoa(int(userSeq.Add(1))) + ".test", "email": "i" + itoa(int(userSeq.Add(1))) + "@example.com", "password": "long enough", "inviteCode": code}
	}
	e.post(t, "com.atproto.server.createAccount", "", in("")).fails(t, 400, "InvalidInviteCode")
	e.post(t, "com.atproto.server.createAccount", "", in("nope")).fails(t, 400, "InvalidInviteCode")

	// Admin auth: Basic admin:<password>, nothing else.
	e.post(t, "com.atproto.server.createInviteCode", "", map[string]any{"useCount": 1}).fails(t, 401, "AuthenticationRequired")
	bad := e.do(t, http.MethodPost, "com.atproto.server.createInviteCode", "", strings.NewReader(`{"useCount":1}`), nil,
		http.Header{"Authorization": {"Basic " + basic("admin", "wrong")}})
	bad.fails(t, 401, "AuthenticationRequired")
	require.NotEmpty(t, bad.header.Get("WWW-Authenticate"))
	res := e.do(t, http.MethodPost, "com.atproto.server.createInviteCode", "", strings.NewReader(`{"useCount":1}`), nil,
		http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}).ok(t)
	code := res.str(t, "code")
	require.NotEmpty(t, code)

	e.post(t, "com.atproto.server.createAccount", "", in(code)).ok(t)
	e.post(t, "com.atproto.server.createAccount", "", in(code)).fails(t, 400, "InvalidInviteCode")

	res = e.do(t, http.MethodPost, "com.atproto.server.createInviteCodes", "", strings.NewReader(`{"codeCount":3,"useCount":2}`), nil,
		http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}).ok(t)
	var out struct {
		Codes []struct {
			Account string   `json:"account"`
			Codes   []string `json:"codes"`
		} `json:"codes"`
	}
	require.NoError(t, json.Unmarshal(res.body, &out))
	require.Len(t, out.Codes, 1)
	require.Len(t, out.Codes[0].Codes, 3)
}

func basic(user, pass string) string {
	req, _ := http.NewRequest(http.MethodGet, "http://x", nil)
	req.SetBasicAuth(user, pass)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

func TestAppPasswords(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)

	ap := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "phone"}).ok(t)
	pw := ap.str(t, "password")
	require.Regexp(t, `^[a-z2-7]{4}-[a-z2-7]{4}-[a-z2-7]{4}-[a-z2-7]{4}$`, pw)
	e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "phone"}).fails(t, 400, "InvalidRequest")

	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": pw}).ok(t)
	appAccess, appRefresh := s.str(t, "accessJwt"), s.str(t, "refreshJwt")
	var c jwt.MapClaims
	_, _, err := jwt.NewParser().ParseUnverified(appAccess, &c)
	require.NoError(t, err)
	require.Equal(t, "com.atproto.appPass", c["scope"])

	// An app password can post but not manage the account.
	e.post(t, "com.atproto.repo.createRecord", appAccess, map[string]any{
		"repo": u.did, "collection": "app.bsky.feed.post", "record": post("from my phone"),
	}).ok(t)
	before := e.rowCounts(t)
	e.post(t, "com.atproto.server.createAppPassword", appAccess, map[string]any{"name": "sneaky"}).fails(t, 400, "InvalidToken")
	e.get(t, "com.atproto.server.listAppPasswords", appAccess, nil).fails(t, 400, "InvalidToken")
	e.post(t, "com.atproto.server.deactivateAccount", appAccess, map[string]any{}).fails(t, 400, "InvalidToken")
	require.Equal(t, before, e.rowCounts(t))
	// Changing the handle is for app passwords too, as on the reference
	// PDS.
	e.post(t, "com.atproto.identity.updateHandle", appAccess, map[string]any{"handle": "renamed.test"}).ok(t)
	require.Equal(t, "renamed.test", e.get(t, "com.atproto.server.getSession", appAccess, nil).ok(t).str(t, "handle"))

	// Refreshing keeps the restricted scope.
	r := e.post(t, "com.atproto.server.refreshSession", appRefresh, nil).ok(t)
	c = jwt.MapClaims{}
	_, _, err = jwt.NewParser().ParseUnverified(r.str(t, "accessJwt"), &c)
	require.NoError(t, err)
	require.Equal(t, "com.atproto.appPass", c["scope"])
	appAccess = r.str(t, "accessJwt")

	l := e.get(t, "com.atproto.server.listAppPasswords", u.access, nil).ok(t)
	require.Contains(t, string(l.body), `"name":"phone"`)
	require.NotContains(t, string(l.body), pw)

	// Revoking ends its sessions.
	e.post(t, "com.atproto.server.revokeAppPassword", u.access, map[string]any{"name": "phone"}).ok(t)
	e.get(t, "com.atproto.server.getSession", appAccess, nil).fails(t, 400, "InvalidToken")
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": pw}).fails(t, 401, "AuthenticationRequired")
	e.post(t, "com.atproto.server.revokeAppPassword", u.access, map[string]any{"name": "phone"}).fails(t, 400, "InvalidRequest")

	// Privileged app passwords get their own scope.
	ap = e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "dm", "privileged": true}).ok(t)
	s = e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.did, "password": ap.str(t, "password")}).ok(t)
	c = jwt.MapClaims{}
	_, _, err = jwt.NewParser().ParseUnverified(s.str(t, "accessJwt"), &c)
	require.NoError(t, err)
	require.Equal(t, "com.atproto.appPassPrivileged", c["scope"])
}

func TestAccountLifecycle(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	ctx := context.Background()
	u := e.createUser(t)
	other := e.createUser(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("hi")}).ok(t)

	st := e.get(t, "com.atproto.server.checkAccountStatus", u.access, nil).ok(t).json(t)
	require.Equal(t, true, st["activated"])
	require.EqualValues(t, 1, st["indexedRecords"])

	e.post(t, "com.atproto.server.deactivateAccount", u.access, map[string]any{}).ok(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("no")}).
		fails(t, 401, "AccountDeactivated")
	sess := e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).json(t)
	require.Equal(t, false, sess["active"])
	require.Equal(t, "deactivated", sess["status"])
	e.get(t, "com.atproto.repo.getRecord", "", url.Values{"repo": {u.did.String()}, "collection": {"app.bsky.feed.post"}, "rkey": {"x"}}).
		fails(t, 400, "RepoDeactivated")
	// A deactivated account can still log in, to reactivate.
	s := e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t).json(t)
	require.Equal(t, false, s["active"])
	e.post(t, "com.atproto.server.activateAccount", u.access, nil).ok(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("back")}).ok(t)

	kinds := e.eventKinds(t, u.did)
	require.Equal(t, []string{"identity", "account", "sync", "commit", "account", "identity", "account", "sync", "commit"}, kinds)

	// Deletion: password plus the mailed code (held: no SMTP here).
	e.post(t, "com.atproto.server.requestAccountDelete", u.access, nil).ok(t)
	code := e.heldCode(t, u.did, email.PurposeDeleteAccount)
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass}).fails(t, 400, "InvalidRequest")
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": "wrong password", "token": code}).fails(t, 401, "AuthenticationRequired")
	// Another account's code does not delete this one (both have the same password here).
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": other.did, "password": other.pass, "token": code}).fails(t, 400, "InvalidToken")
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": "AAAAA-AAAAA"}).fails(t, 400, "InvalidToken")
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": code}).ok(t)

	var n int
	for _, table := range []string{"accounts", "repo_roots", "repo_nodes", "records", "refresh_tokens"} {
		require.NoError(t, e.pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE did = $1", u.did.String()).Scan(&n))
		require.Zero(t, n, table)
	}
	kinds = e.eventKinds(t, u.did)
	require.Equal(t, "account", kinds[len(kinds)-1])
	var body []byte
	require.NoError(t, e.pool.QueryRow(ctx, "SELECT body FROM events WHERE did = $1 ORDER BY id DESC LIMIT 1", u.did.String()).Scan(&body))
	var acct comatproto.SyncSubscribeRepos_Account
	require.NoError(t, acct.UnmarshalCBOR(bytes.NewReader(body)))
	require.False(t, acct.Active)
	require.NotNil(t, acct.Status)
	require.Equal(t, "deleted", *acct.Status)
	require.Equal(t, u.did.String(), acct.Did)
	e.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, 400, "InvalidToken")
	e.get(t, "com.atproto.repo.describeRepo", "", url.Values{"repo": {u.did.String()}}).fails(t, 400, "RepoNotFound")
	// The other account is untouched.
	e.get(t, "com.atproto.repo.describeRepo", "", url.Values{"repo": {other.did.String()}}).ok(t)
	// The handle is free again.
	e.post(t, "com.atproto.server.createAccount", "", map[string]any{"handle": u.handle, "email": "again@example.com", "password": "long enough"}).ok(t)
}

func TestIdentity(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)

	r := e.get(t, "com.atproto.identity.resolveHandle", "", url.Values{"handle": {strings.ToUpper(u.handle)}}).ok(t)
	require.Equal(t, u.did.String(), r.str(t, "did"))
	e.get(t, "com.atproto.identity.resolveHandle", "", url.Values{"handle": {"nobody.test"}}).fails(t, 400, "HandleNotFound")
	e.get(t, "com.atproto.identity.resolveHandle", "", url.Values{"handle": {"not a handle"}}).fails(t, 400, "InvalidRequest")

	creds := e.get(t, "com.atproto.identity.getRecommendedDidCredentials", u.access, nil).ok(t).json(t)
	require.Equal(t, []any{e.accounts.RotationKey()}, creds["rotationKeys"])

	// updateHandle: PLC document, database, #identity.
	e.post(t, "com.atproto.identity.updateHandle", u.access, map[string]any{"handle": "Renamed" + itoa(int(userSeq.Add(1))) + ".test"}).ok(t)
	sess := e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t)
	newHandle := sess.str(t, "handle")
	require.True(t, strings.HasPrefix(newHandle, "renamed"))
	log := e.plc.Log(u.did.String())
	require.Len(t, log, 2)
	require.Equal(t, []string{"at://" + newHandle}, log[1].Operation.Regular.AlsoKnownAs)
	require.NoError(t, didplc.VerifyOpLog(log))
	kinds := e.eventKinds(t, u.did)
	require.Equal(t, "identity", kinds[len(kinds)-1])

	other := e.createUser(t)
	before := e.rowCounts(t)
	e.post(t, "com.atproto.identity.updateHandle", other.access, map[string]any{"handle": newHandle}).fails(t, 400, "HandleNotAvailable")
	// A domain of the user's own must resolve to the DID (own_handle_test.go);
	// a reserved top-level domain never can, and is refused before any lookup.
	e.post(t, "com.atproto.identity.updateHandle", other.access, map[string]any{"handle": "x.example"}).fails(t, 400, "InvalidHandle")
	require.Equal(t, before, e.rowCounts(t))

	// /.well-known/atproto-did answers for the handle in the Host header.
	req, err := http.NewRequest(http.MethodGet, e.url+"/.well-known/atproto-did", nil)
	require.NoError(t, err)
	req.Host = newHandle
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b := make([]byte, 100)
	n, _ := resp.Body.Read(b)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, u.did.String(), string(b[:n]))
	req.Host = "nobody.test"
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// jti returns a token's jti claim (unverified).
func jti(t testing.TB, token string) string {
	t.Helper()
	var c jwt.MapClaims
	_, _, err := jwt.NewParser().ParseUnverified(token, &c)
	require.NoError(t, err)
	id, _ := c["jti"].(string)
	return id
}

func TestCreateAccountConcurrentSameHandle(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	const n = 4
	type result struct {
		r   xrpcResult
		err error
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			// No require in these goroutines: FailNow belongs to the test's own.
			body := strings.NewReader(`{"handle":"race.test","email":"race` + itoa(i) + `@example.com","password":"long enough"}`)
			resp, err := http.Post(e.url+"/xrpc/com.atproto.server.createAccount", "application/json", body)
			if err != nil {
				results <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			results <- result{r: xrpcResult{status: resp.StatusCode, header: resp.Header, body: b}, err: err}
		}()
	}
	ok := 0
	for range n {
		res := <-results
		require.NoError(t, res.err)
		r := res.r
		if r.status == http.StatusOK {
			ok++
			continue
		}
		r.fails(t, http.StatusBadRequest, "HandleNotAvailable")
	}
	require.Equal(t, 1, ok)
	require.Equal(t, 1, e.plc.Count(), "only the winner's DID reached the directory")
	counts := e.rowCounts(t)
	require.Equal(t, 1, counts["accounts"])
	require.Equal(t, 3, counts["events"])
}

// recordingCleaner is an account.Cleaner that notes the DIDs it is called
// for, failing while fail is set.
type recordingCleaner struct {
	mu   sync.Mutex
	dids []syntax.DID
	fail bool
}

func (c *recordingCleaner) DeleteAccountTx(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return errors.New("cleaner refused")
	}
	c.dids = append(c.dids, did)
	return nil
}

func TestDeleteAccountCleaners(t *testing.T) {
	t.Parallel()
	cl := &recordingCleaner{fail: true}
	e := newAccountEnv(t, envOptions{cleaners: []account.Cleaner{cl}})
	u := e.createUser(t)
	e.post(t, "com.atproto.server.requestAccountDelete", u.access, nil).ok(t)
	code := e.heldCode(t, u.did, email.PurposeDeleteAccount)
	before := e.rowCounts(t)
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": code}).
		fails(t, http.StatusInternalServerError, "InternalServerError")
	require.Equal(t, before, e.rowCounts(t), "a failing cleaner aborts the whole deletion")
	cl.mu.Lock()
	cl.fail = false
	cl.mu.Unlock()
	e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": code}).ok(t)
	require.Equal(t, []syntax.DID{u.did}, cl.dids)
}

func TestGetServiceAuth(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	ctx := context.Background()
	u := e.createUser(t)
	pub, err := e.accounts.PublicKey(ctx, u.did)
	require.NoError(t, err)
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: u.did, Keys: map[string]identity.VerificationMethod{
		"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()},
	}})
	v := auth.ServiceAuthValidator{Audience: "did:web:feeds.example.com", Dir: dir}

	q := url.Values{"aud": {"did:web:feeds.example.com"}, "lxm": {"app.bsky.feed.getFeedSkeleton"}}
	tok := e.get(t, "com.atproto.server.getServiceAuth", u.access, q).ok(t).str(t, "token")
	lxm := syntax.NSID("app.bsky.feed.getFeedSkeleton")
	iss, err := v.Validate(ctx, tok, &lxm)
	require.NoError(t, err)
	require.Equal(t, u.did, iss)
	other := syntax.NSID("app.bsky.feed.getTimeline")
	_, err = v.Validate(ctx, tok, &other)
	require.Error(t, err, "a token is good for its lxm only")
	var c jwt.MapClaims
	_, _, err = jwt.NewParser().ParseUnverified(tok, &c)
	require.NoError(t, err)
	require.Equal(t, "did:web:feeds.example.com", c["aud"], "aud is a single string")

	e.get(t, "com.atproto.server.getServiceAuth", u.access, url.Values{"aud": {"not a did"}}).fails(t, 400, "InvalidRequest")
	e.get(t, "com.atproto.server.getServiceAuth", u.access, url.Values{"aud": {"did:web:x.example"}, "lxm": {"com.atproto.server.createAppPassword"}}).
		fails(t, 400, "InvalidRequest")
	e.get(t, "com.atproto.server.getServiceAuth", u.access, url.Values{"aud": {"did:web:x.example"}, "exp": {itoa(int(time.Now().Add(2 * time.Hour).Unix()))}}).
		fails(t, 400, "BadExpiration")
	e.get(t, "com.atproto.server.getServiceAuth", u.access, url.Values{"aud": {"did:web:x.example"}, "exp": {itoa(int(time.Now().Add(10 * time.Minute).Unix()))}}).
		fails(t, 400, "BadExpiration")
	e.get(t, "com.atproto.server.getServiceAuth", u.access, url.Values{"aud": {"did:web:x.example"}, "lxm": {"app.bsky.feed.getTimeline"},
		"exp": {itoa(int(time.Now().Add(10 * time.Minute).Unix()))}}).ok(t)
	e.get(t, "com.atproto.server.getServiceAuth", "", url.Values{"aud": {"did:web:x.example"}}).fails(t, 401, "AuthenticationRequired")
}

func TestConcurrentRefreshGetsOneSuccessor(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	const n = 4
	type result struct {
		status int
		body   []byte
		err    error
	}
	results := make(chan result, n)
	for range n {
		go func() {
			req, _ := http.NewRequest(http.MethodPost, e.url+"/xrpc/com.atproto.server.refreshSession", nil)
			req.Header.Set("Authorization", "Bearer "+u.refresh)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- result{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			results <- result{status: resp.StatusCode, body: b, err: err}
		}()
	}
	ids := map[string]bool{}
	for range n {
		r := <-results
		require.NoError(t, r.err)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var out struct {
			RefreshJwt string `json:"refreshJwt"`
		}
		require.NoError(t, json.Unmarshal(r.body, &out))
		ids[jti(t, out.RefreshJwt)] = true
	}
	require.Len(t, ids, 1, "concurrent refreshes of one token share one successor")
	var rows int
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM refresh_tokens WHERE did = $1", u.did.String()).Scan(&rows))
	require.Equal(t, 2, rows, "the exchanged token (in its grace period) and its successor")
}
