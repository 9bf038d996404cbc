package pds

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/internal/fakeservices"
	"github.com/bulwark-pds/bulwark/outbound"
)

// TestOAuthProxyFollowsGrant: proxied calls go only where the grant's
// rpc: permissions reach, with a service token the service verifies; chat
// needs transition:chat.bsky besides transition:generic.
func TestOAuthProxyFollowsGrant(t *testing.T) {
	t.Parallel()
	var fakes *fakeservices.Services
	e := newOAuthEnv(t, oauthEnvOptions{
		configure: func(cfg *config.Config) {
			f, err := fakeservices.Start(context.Background(), fakeservices.Config{PLCURL: cfg.PLCURL})
			require.NoError(t, err)
			t.Cleanup(f.Close)
			fakes = f
			cfg.AppViewURL, cfg.AppViewDID = f.AppView.URL, f.AppView.DID.String()
			cfg.ProxyAllowPrivate = loopback
		},
		options: func(o *Options) {
			o.Outbound = outbound.New(outbound.Config{AllowCIDRs: loopback, Logger: slog.New(slog.DiscardHandler)})
		},
	})
	u := e.newUser()
	appView := fakes.AppView.DID.String() + "#bsky_appview"
	countCalls := func(method string) int {
		n := 0
		for _, c := range fakes.Calls() {
			if c.Method == method {
				require.True(t, c.Verified, "%+v", c)
				require.Equal(t, u.did.String(), c.Iss)
				n++
			}
		}
		return n
	}

	reader := e.session(e.app("reader", "atproto", "rpc:app.bsky.feed.getTimeline?aud="+strings.ReplaceAll(appView, "#", "%23")), u)
	e.xrpcCall(reader, http.MethodGet, "app.bsky.feed.getTimeline", nil).ok(t)
	require.Equal(t, 1, countCalls("app.bsky.feed.getTimeline"))
	res := e.xrpcCall(reader, http.MethodGet, "app.bsky.feed.getAuthorFeed?actor="+u.did.String(), nil)
	requireScopeRefusal(t, res, "rpc:app.bsky.feed.getAuthorFeed")
	require.Zero(t, countCalls("app.bsky.feed.getAuthorFeed"), "a refused call never reaches the service")

	chatHeader := http.Header{"Atproto-Proxy": {fakes.Chat.DID.String() + "#bsky_chat"}}
	generic := e.session(e.app("generic", "atproto", "transition:generic"), u)
	e.xrpcCall(generic, http.MethodGet, "app.bsky.feed.getAuthorFeed?actor="+u.did.String(), nil).ok(t)
	requireScopeRefusal(t, e.xrpcCall(generic, http.MethodGet, "chat.bsky.convo.listConvos", nil, chatHeader), "")
	require.Zero(t, countCalls("chat.bsky.convo.listConvos"))

	chat := e.session(e.app("chat", "atproto", "transition:generic", "transition:chat.bsky"), u)
	e.xrpcCall(chat, http.MethodGet, "chat.bsky.convo.listConvos", nil, chatHeader).ok(t)
	require.Equal(t, 1, countCalls("chat.bsky.convo.listConvos"))

	// The atproto scope alone reaches no service.
	who := e.session(e.app("who", "atproto"), u)
	requireScopeRefusal(t, e.xrpcCall(who, http.MethodGet, "app.bsky.feed.getTimeline", nil), "")
}

// TestOAuthAccountMethodsNeedTheirPermission: preferences need
// transition:generic; changing the email account:email?action=manage; PLC
// operations identity:*; deactivation and deletion no grant at all.
func TestOAuthAccountMethodsNeedTheirPermission(t *testing.T) {
	t.Parallel()
	e := newOAuthEnv(t, oauthEnvOptions{})
	u := e.newUser()
	prefs := map[string]any{"preferences": []any{map[string]any{"$type": "app.bsky.actor.defs#adultContentPref", "enabled": false}}}

	posts := e.session(e.app("poster", "atproto", "repo:app.bsky.feed.post?action=create"), u)
	for _, c := range []struct {
		method, nsid string
		body         any
		need         string
	}{
		{"GET", "app.bsky.actor.getPreferences", nil, "transition:generic"},
		{"POST", "app.bsky.actor.putPreferences", prefs, "transition:generic"},
		{"POST", "com.atproto.server.requestEmailUpdate", nil, "account:email?action=manage"},
		{"POST", "com.atproto.server.updateEmail", map[string]any{"email": "elsewhere@example.com"}, "account:email?action=manage"},
		{"POST", "com.atproto.server.requestEmailConfirmation", nil, "account:email?action=manage"},
		{"POST", "com.atproto.identity.requestPlcOperationSignature", nil, "identity:*"},
		{"POST", "com.atproto.identity.signPlcOperation", map[string]any{"token": "AAAAA-BBBBB"}, "identity:*"},
		{"POST", "com.atproto.repo.importRepo", map[string]any{}, "account:repo?action=manage"},
		{"POST", "com.atproto.server.deactivateAccount", map[string]any{}, ""},
		{"POST", "com.atproto.server.requestAccountDelete", nil, ""},
	} {
		res := e.xrpcCall(posts, c.method, c.nsid, c.body)
		require.Equal(t, http.StatusForbidden, res.status, "%s: %s", c.nsid, res.body)
		requireScopeRefusal(t, res, c.need)
	}

	generic := e.session(e.app("generic", "atproto", "transition:generic"), u)
	e.xrpcCall(generic, http.MethodPost, "app.bsky.actor.putPreferences", prefs).ok(t)
	require.Len(t, e.xrpcCall(generic, http.MethodGet, "app.bsky.actor.getPreferences", nil).ok(t).json(t)["preferences"], 1)
	requireScopeRefusal(t, e.xrpcCall(generic, http.MethodPost, "com.atproto.server.updateEmail", map[string]any{"email": "elsewhere@example.com"}), "account:email?action=manage")

	manager := e.session(e.app("manager", "atproto", "account:email?action=manage", "account:repo?action=manage", "identity:*"), u)
	e.xrpcCall(manager, http.MethodPost, "com.atproto.server.requestEmailUpdate", nil).ok(t)
	e.xrpcCall(manager, http.MethodPost, "com.atproto.server.updateEmail", map[string]any{"email": "moved@example.com"}).ok(t)
	require.Equal(t, "moved@example.com", e.xrpcCall(manager, http.MethodGet, "com.atproto.server.getSession", nil).ok(t).str(t, "email"))
	e.xrpcCall(manager, http.MethodPost, "com.atproto.identity.requestPlcOperationSignature", nil).ok(t)
	code := e.heldCode(t, u.did, email.PurposePLCOperation)
	require.NotEmpty(t, code)
	op := e.xrpcCall(manager, http.MethodPost, "com.atproto.identity.signPlcOperation", map[string]any{"token": code}).ok(t)
	require.NotNil(t, op.json(t)["operation"])
	// account:repo?action=manage imports a repository: its own, here.
	car := e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {u.did.String()}}).ok(t).body
	req, err := http.NewRequest(http.MethodPost, e.publicURL()+"/xrpc/com.atproto.repo.importRepo", bytes.NewReader(car))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/vnd.ipld.car")
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(car)), nil }
	resp, err := manager.DoWithAuth(http.DefaultClient, req, "com.atproto.repo.importRepo")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	// Manage is not deactivate: no grant reaches that.
	requireScopeRefusal(t, e.xrpcCall(manager, http.MethodPost, "com.atproto.server.deactivateAccount", map[string]any{}), "")
}
