package pds

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
)

// appSession creates an app password for u on e and returns a session
// made with it.
func (e *accountEnv) appSession(t *testing.T, u *user, name string, privileged bool) string {
	t.Helper()
	pw := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": name, "privileged": privileged}).ok(t).str(t, "password")
	return e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": pw}).ok(t).str(t, "accessJwt")
}

// TestGetServiceAuthRules: every refusal of getServiceAuth the reference
// PDS makes, each with its name, and what a taken-down account may still
// mint.
func TestGetServiceAuthRules(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	app := e.appSession(t, u, "plain", false)
	priv := e.appSession(t, u, "privileged", true)
	const aud = "did:web:other.example.com"
	in := func(d time.Duration) string { return strconv.FormatInt(time.Now().Add(d).Unix(), 10) }
	q := func(kv ...string) url.Values {
		v := url.Values{"aud": {aud}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	for _, tc := range []struct {
		name, token string
		q           url.Values
		status      int
		error       string
	}{
		{"exp over an hour ahead", u.access, q("lxm", "app.bsky.feed.getTimeline", "exp", in(61*time.Minute)), 400, "BadExpiration"},
		{"exp in the past", u.access, q("lxm", "app.bsky.feed.getTimeline", "exp", in(-time.Minute)), 400, "BadExpiration"},
		{"no lxm, exp over a minute ahead", u.access, q("exp", in(2*time.Minute)), 400, "BadExpiration"},
		{"exp not a number", u.access, q("exp", "soon"), 400, "InvalidRequest"},
		{"protected: signPlcOperation", u.access, q("lxm", "com.atproto.identity.signPlcOperation"), 400, "InvalidRequest"},
		{"protected: activateAccount", u.access, q("lxm", "com.atproto.server.activateAccount"), 400, "InvalidRequest"},
		{"protected: getSession", u.access, q("lxm", "com.atproto.server.getSession"), 400, "InvalidRequest"},
		{"privileged chat, plain app password", app, q("lxm", "chat.bsky.convo.getLog"), 400, "InvalidRequest"},
		{"privileged createAccount, plain app password", app, q("lxm", createAccountNSID), 400, "InvalidRequest"},
		{"lxm not an NSID", u.access, q("lxm", "not an nsid"), 400, "InvalidRequest"},
		{"privileged chat, privileged app password", priv, q("lxm", "chat.bsky.convo.getLog"), 200, ""},
		{"an hour ahead with lxm", u.access, q("lxm", "app.bsky.feed.getTimeline", "exp", in(59*time.Minute)), 200, ""},
		{"a minute ahead without lxm", u.access, q("exp", in(50*time.Second)), 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.get(t, "com.atproto.server.getServiceAuth", tc.token, tc.q)
			if tc.status == 200 {
				require.NotEmpty(t, res.ok(t).str(t, "token"))
				return
			}
			res.fails(t, tc.status, tc.error)
		})
	}

	// A taken-down account (its session still alive) may mint a token
	// only to create its account elsewhere.
	require.NoError(t, e.accounts.SetStatus(context.Background(), u.did, account.StatusTakendown))
	e.get(t, "com.atproto.server.getServiceAuth", u.access, q("lxm", "com.atproto.repo.createRecord")).fails(t, 400, "InvalidToken")
	e.get(t, "com.atproto.server.getServiceAuth", u.access, q()).fails(t, 400, "InvalidToken")
	require.NotEmpty(t, e.get(t, "com.atproto.server.getServiceAuth", u.access, q("lxm", createAccountNSID)).ok(t).str(t, "token"))
	e.get(t, "com.atproto.server.getSession", u.access, nil).fails(t, 401, "AccountTakedown")
}
