package pds

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/internal/fakeservices"
	"github.com/bulwark-pds/bulwark/outbound"
)

// proxyEnv is a running Bulwark with the service proxy on, pointed at a
// fake app view, chat service and feed generator whose DIDs live in the
// same local PLC directory as the accounts', so that each fake verifies
// the tokens it gets as a real service would.
type proxyEnv struct {
	*accountEnv
	fakes *fakeservices.Services
}

type proxyEnvOptions struct {
	// noAllow leaves --proxy-allow-private empty: the fakes, on 127.0.0.1,
	// are then out of reach, and the configured app view is named
	// https://appview.test:<its port>, a name that resolves to 127.0.0.1
	// (a name the start-up check cannot judge; an address it refuses).
	noAllow bool
	// logs receives the server's log.
	logs *lockedBuffer
	// configure adjusts the config after the fakes are set.
	configure func(*config.Config)
	// options adjusts the server's Options (budget, limits).
	options func(*Options)
}

var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

func newProxyEnv(t testing.TB, po proxyEnvOptions) *proxyEnv {
	t.Helper()
	var fakes *fakeservices.Services
	e := newAccountEnv(t, envOptions{
		configure: func(cfg *config.Config) {
			f, err := fakeservices.Start(context.Background(), fakeservices.Config{PLCURL: cfg.PLCURL})
			require.NoError(t, err)
			t.Cleanup(f.Close)
			fakes = f
			cfg.AppViewURL, cfg.AppViewDID = f.AppView.URL, f.AppView.DID.String()
			if po.noAllow {
				cfg.AppViewURL = strings.Replace(f.AppView.URL, "http://127.0.0.1", "https://appview.test", 1)
			} else {
				cfg.ProxyAllowPrivate = loopback
			}
			if po.configure != nil {
				po.configure(cfg)
			}
		},
		logs: po.logs,
		options: func(o *Options) {
			o.Outbound = outbound.New(outbound.Config{AllowCIDRs: o.Config.ProxyAllowPrivate, Logger: slog.New(slog.DiscardHandler), Resolver: testResolver{}})
			if po.options != nil {
				po.options(o)
			}
		},
	})
	return &proxyEnv{accountEnv: e, fakes: fakes}
}

// call makes an XRPC GET with optional token and atproto-proxy header.
func (e *proxyEnv) call(t testing.TB, nsid, token, proxyHeader string, q url.Values) xrpcResult {
	t.Helper()
	var h http.Header
	if proxyHeader != "" {
		h = http.Header{"Atproto-Proxy": {proxyHeader}}
	}
	return e.do(t, http.MethodGet, nsid, token, nil, q, h)
}

// calls returns what the fakes received for method.
func (e *proxyEnv) calls(method string) []fakeservices.Call {
	var out []fakeservices.Call
	for _, c := range e.fakes.Calls() {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// requireOneVerified asserts that method reached service once, with a
// token from iss for aud and lxm that the service verified.
func (e *proxyEnv) requireOneVerified(t testing.TB, service, method string, iss, aud syntax.DID, lxm string) {
	t.Helper()
	var got []fakeservices.Call
	for _, c := range e.calls(method) {
		if c.Service == service {
			got = append(got, c)
		}
	}
	require.Len(t, got, 1, "calls of %s on %s: %+v", method, service, e.fakes.Calls())
	require.Equal(t, fakeservices.Call{Service: service, Method: method, Iss: iss.String(), Aud: aud.String(), Lxm: lxm, Verified: true}, got[0])
}

// registerService puts a DID in the PLC directory whose document lists
// service id at endpoint.
func (e *proxyEnv) registerService(t testing.TB, id, endpoint string) syntax.DID {
	t.Helper()
	did, _, err := fakeservices.Register(context.Background(), e.plcURL, map[string]didplc.OpService{id: {Type: "BskyAppView", Endpoint: endpoint}})
	require.NoError(t, err)
	return did
}

// appPasswordSession logs in with a new app password of u's.
func (e *proxyEnv) appPasswordSession(t testing.TB, u *user, privileged bool) string {
	t.Helper()
	name := "app" + itoa(int(userSeq.Add(1)))
	pw := e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": name, "privileged": privileged}).ok(t).str(t, "password")
	return e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": pw}).ok(t).str(t, "accessJwt")
}

// testResolver resolves appview.test to 127.0.0.1 and every other name as
// the system does.
type testResolver struct{}

func (testResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if host == "appview.test" {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}

func (testResolver) LookupTXT(ctx context.Context, name string) ([]string, error) {
	return net.DefaultResolver.LookupTXT(ctx, name)
}
