package pds

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// requireNamedError checks that r is an XRPC error with status and name.
func requireNamedError(t *testing.T, r xrpcResult, status int, name string) {
	t.Helper()
	r.fails(t, status, name)
}

// requireNoUpstreamCall checks that none of the fakes was called.
func (e *proxyEnv) requireNoUpstreamCall(t *testing.T) {
	t.Helper()
	require.Empty(t, e.fakes.Calls())
}

// protectedMethods are the reference PDS's PROTECTED_METHODS, with the
// verb each is called with.
var protectedMethodVerbs = map[string]string{
	"com.atproto.admin.sendEmail":                       http.MethodPost,
	"com.atproto.identity.requestPlcOperationSignature": http.MethodPost,
	"com.atproto.identity.signPlcOperation":             http.MethodPost,
	"com.atproto.identity.updateHandle":                 http.MethodPost,
	"com.atproto.server.activateAccount":                http.MethodPost,
	"com.atproto.server.confirmEmail":                   http.MethodPost,
	"com.atproto.server.createAppPassword":              http.MethodPost,
	"com.atproto.server.deactivateAccount":              http.MethodPost,
	"com.atproto.server.getAccountInviteCodes":          http.MethodGet,
	"com.atproto.server.getSession":                     http.MethodGet,
	"com.atproto.server.listAppPasswords":               http.MethodGet,
	"com.atproto.server.requestAccountDelete":           http.MethodPost,
	"com.atproto.server.requestEmailConfirmation":       http.MethodPost,
	"com.atproto.server.requestEmailUpdate":             http.MethodPost,
	"com.atproto.server.revokeAppPassword":              http.MethodPost,
	"com.atproto.server.updateEmail":                    http.MethodPost,
}

// Account-management methods never leave the server, whatever the
// atproto-proxy header says: served here, or refused here.
func TestProxyNeverForwardsProtectedMethods(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, proxyEnvOptions{})
	u := e.createUser(t)
	header := http.Header{"Atproto-Proxy": {e.fakes.AppView.DID.String() + "#bsky_appview"}}
	for nsid, verb := range protectedMethodVerbs {
		body := func() io.Reader {
			if verb == http.MethodPost {
				return strings.NewReader("{}")
			}
			return nil
		}
		anon := e.do(t, verb, nsid, "", body(), nil, header)
		require.GreaterOrEqual(t, anon.status, 400, nsid)
		require.NotEmpty(t, anon.str(t, "error"), nsid)
		if _, local := e.server.methods[nsid]; local {
			continue // served here: with a session it would do its work
		}
		requireNamedError(t, e.do(t, verb, nsid, u.access, body(), nil, header), http.StatusNotImplemented, "MethodNotImplemented")
	}
	e.requireNoUpstreamCall(t)
}

func TestProxyRefusesBeforeAnyUpstreamCall(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, proxyEnvOptions{})
	u := e.createUser(t)
	chatHeader := e.fakes.Chat.DID.String() + "#bsky_chat"
	av := e.fakes.AppView.DID.String()

	t.Run("chat from an ordinary app password", func(t *testing.T) {
		app := e.appPasswordSession(t, u, false)
		requireNamedError(t, e.call(t, "chat.bsky.convo.listConvos", app, chatHeader, nil), http.StatusBadRequest, "InvalidToken")
		requireNamedError(t, e.call(t, "chat.bsky.convo.listConvos", "", chatHeader, nil), http.StatusBadRequest, "InvalidToken")
	})
	t.Run("malformed atproto-proxy headers", func(t *testing.T) {
		for _, h := range []string{
			av,                        // no service id
			"#bsky_appview",           // no DID
			av + "#",                  // empty service id
			av + "#bsky_appview#more", // two '#'
			av + "#bsky appview",      // a space
			"not-a-did#bsky_appview",
			av + "#bsky_app/view",
			av + "#" + strings.Repeat("x", 200),
		} {
			requireNamedError(t, e.call(t, "app.bsky.feed.getTimeline", u.access, h, nil), http.StatusBadRequest, "InvalidRequest")
		}
		two := http.Header{"Atproto-Proxy": {av + "#bsky_appview", chatHeader}}
		requireNamedError(t, e.do(t, http.MethodGet, "app.bsky.feed.getTimeline", u.access, nil, nil, two), http.StatusBadRequest, "InvalidRequest")
	})
	t.Run("a DID without the service, or none at all", func(t *testing.T) {
		requireNamedError(t, e.call(t, "chat.bsky.convo.listConvos", u.access, av+"#bsky_chat", nil), http.StatusBadRequest, "InvalidRequest")
		requireNamedError(t, e.call(t, "app.bsky.feed.getTimeline", u.access, e.fakes.Chat.DID.String()+"#bsky_appview", nil), http.StatusBadRequest, "InvalidRequest")
		requireNamedError(t, e.call(t, "app.bsky.feed.getTimeline", u.access, "did:plc:notregistered234567abcdef#bsky_appview", nil), http.StatusBadRequest, "InvalidRequest")
	})
	t.Run("invalid credentials", func(t *testing.T) {
		requireNamedError(t, e.call(t, "app.bsky.feed.getTimeline", "not.a.token", "", nil), http.StatusBadRequest, "InvalidToken")
		basic := http.Header{"Authorization": {"Basic YWRtaW46eA=="}}
		requireNamedError(t, e.do(t, http.MethodGet, "app.bsky.feed.getTimeline", "", nil, nil, basic), http.StatusBadRequest, "InvalidToken")
	})
	t.Run("verbs XRPC does not use", func(t *testing.T) {
		res := e.do(t, http.MethodPut, "app.bsky.feed.getTimeline", u.access, strings.NewReader("{}"), nil, nil)
		requireNamedError(t, res, http.StatusMethodNotAllowed, "InvalidRequest")
	})
	e.requireNoUpstreamCall(t)
}

// The global per-address rate limit counts proxied calls, and a refusal
// costs the upstream nothing.
func TestProxyRateLimited(t *testing.T) {
	t.Parallel()
	policies := ratelimit.DefaultPolicies()
	rules, err := ratelimit.ParseRules("4/5m")
	require.NoError(t, err)
	policies[ratelimit.PolicyGlobal] = rules
	set, err := ratelimit.NewSet(policies, 0)
	require.NoError(t, err)
	e := newProxyEnv(t, proxyEnvOptions{
		configure: func(c *config.Config) { c.RefusalCoolOff = 0 },
		options:   func(o *Options) { o.Limits = set },
	})
	u := e.createUser(t) // createAccount: the first of the four
	for range 3 {
		e.call(t, "app.bsky.actor.getProfile", u.access, "", url.Values{"actor": {u.did.String()}}).ok(t)
	}
	res := e.call(t, "app.bsky.actor.getProfile", u.access, "", url.Values{"actor": {u.did.String()}})
	requireNamedError(t, res, http.StatusTooManyRequests, "RateLimitExceeded")
	require.NotEmpty(t, res.header.Get("Retry-After"))
	require.Len(t, e.fakes.Calls(), 3)
}
