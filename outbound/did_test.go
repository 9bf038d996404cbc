package outbound

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// plcEnv is a verifying PLC directory on 127.0.0.1 that counts reads, and
// a guarded client that may not reach 127.0.0.1.
type plcEnv struct {
	plc      *plctest.Directory
	url      string
	reads    atomic.Int64
	resolver *fakeResolver
	web      *Client
}

func newPLCEnv(t *testing.T) *plcEnv {
	t.Helper()
	e := &plcEnv{plc: plctest.New(), resolver: &fakeResolver{txt: map[string][]string{}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			e.reads.Add(1)
		}
		e.plc.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	e.web = newTestClient(t, Config{Resolver: e.resolver}, nil)
	return e
}

// register creates a did:plc declaring handle, signed by a new key.
func (e *plcEnv) register(t *testing.T, handle string) (syntax.DID, atcrypto.PrivateKey) {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	pub, err := key.PublicKey()
	require.NoError(t, err)
	op, err := didplc.NewAtproto(key, handle, "https://pds.example.com", []string{pub.DIDKey()})
	require.NoError(t, err)
	did, err := op.DID()
	require.NoError(t, err)
	require.NoError(t, e.plc.Submit(did, didplc.OpEnum{Regular: &op}))
	return syntax.DID(did), key
}

func TestDirectoryPLC(t *testing.T) {
	t.Parallel()
	e := newPLCEnv(t)
	ctx := context.Background()
	alice, aliceKey := e.register(t, "alice.example.com")
	mallory, _ := e.register(t, "mallory.example.com")
	e.resolver.txt["_atproto.alice.example.com"] = []string{"did=" + alice.String()}
	e.resolver.txt["_atproto.bob.example.com"] = []string{"did=" + alice.String()}
	e.resolver.txt["_atproto.mallory.example.com"] = []string{"did=" + alice.String()}
	dir := NewDirectory(DirectoryConfig{PLCURL: e.url + "/"}, e.web)

	ident, err := dir.LookupDID(ctx, alice)
	require.NoError(t, err)
	require.Equal(t, alice, ident.DID)
	require.Equal(t, syntax.Handle("alice.example.com"), ident.Handle, "the handle resolves back")
	require.Equal(t, "https://pds.example.com", ident.PDSEndpoint())
	pub, err := ident.PublicKey()
	require.NoError(t, err)
	want, _ := aliceKey.PublicKey()
	require.Equal(t, want.DIDKey(), pub.DIDKey())
	require.EqualValues(t, 1, e.reads.Load())
	txt := e.resolver.txtN.Load()

	// Cached: neither the directory nor DNS is asked again.
	_, err = dir.LookupDID(ctx, alice)
	require.NoError(t, err)
	require.EqualValues(t, 1, e.reads.Load())
	require.Equal(t, txt, e.resolver.txtN.Load())
	// Purged: asked again.
	require.NoError(t, dir.Purge(ctx, alice.AtIdentifier()))
	_, err = dir.LookupDID(ctx, alice)
	require.NoError(t, err)
	require.EqualValues(t, 2, e.reads.Load())

	// mallory.example.com's TXT names alice: mallory's handle is invalid.
	ident, err = dir.LookupDID(ctx, mallory)
	require.NoError(t, err)
	require.Equal(t, syntax.HandleInvalid, ident.Handle)

	// By handle: the document must declare the handle back.
	ident, err = dir.Lookup(ctx, syntax.AtIdentifier("Alice.Example.com"))
	require.NoError(t, err)
	require.Equal(t, alice, ident.DID)
	_, err = dir.LookupHandle(ctx, "bob.example.com")
	require.ErrorIs(t, err, identity.ErrHandleMismatch)
	_, err = dir.LookupHandle(ctx, "nobody.example.com")
	require.ErrorIs(t, err, ErrHandleNotFound)

	// Unknown DIDs are not found, and that is remembered for a while.
	reads := e.reads.Load()
	unknown := syntax.DID("did:plc:zzzzzzzzzzzzzzzzzzzzzzzz")
	for range 2 {
		_, err = dir.LookupDID(ctx, unknown)
		require.ErrorIs(t, err, ErrDIDNotFound)
	}
	require.Equal(t, reads+1, e.reads.Load())
	for _, did := range []syntax.DID{"did:plc:short", "did:plc:AAAAAAAAAAAAAAAAAAAAAAAA", "did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme"} {
		_, err = dir.ResolveDID(ctx, did)
		require.ErrorIs(t, err, ErrDIDNotFound, did)
	}
	require.Equal(t, reads+1, e.reads.Load(), "invalid DIDs never reach the directory")
}

func TestDirectoryServiceAuth(t *testing.T) {
	t.Parallel()
	e := newPLCEnv(t)
	ctx := context.Background()
	alice, key := e.register(t, "alice.example.com")
	dir := NewDirectory(DirectoryConfig{PLCURL: e.url, SkipHandleVerification: true}, e.web)
	const aud = "did:web:pds.example.com"
	lxm := syntax.NSID("com.atproto.repo.uploadBlob")
	v := auth.ServiceAuthValidator{Audience: aud, Dir: dir}

	token, err := auth.SignServiceAuth(alice, aud, time.Minute, &lxm, key)
	require.NoError(t, err)
	got, err := v.Validate(ctx, token, &lxm)
	require.NoError(t, err)
	require.Equal(t, alice, got)
	require.Zero(t, e.resolver.txtN.Load(), "no handle resolution when skipped")

	other, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	forged, err := auth.SignServiceAuth(alice, aud, time.Minute, &lxm, other)
	require.NoError(t, err)
	reads := e.reads.Load()
	_, err = v.Validate(ctx, forged, &lxm)
	require.Error(t, err)
	require.Equal(t, reads+1, e.reads.Load(), "a bad signature purges and re-reads the document")
}

func TestDirectoryDIDWeb(t *testing.T) {
	t.Parallel()
	const feedDoc = `{"id":"did:web:feed.example.com","service":[
		{"id":"#bsky_fg","type":"BskyFeedGenerator","serviceEndpoint":"https://feed.example.com"}]}`
	mux := http.NewServeMux()
	mux.Handle("/feed/.well-known/did.json", text(feedDoc))
	mux.Handle("/liar/.well-known/did.json", text(feedDoc))
	mux.Handle("/junk/.well-known/did.json", text(`{"id":`))
	mux.HandleFunc("/moved/.well-known/did.json", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "https://feed.example.com/.well-known/did.json", http.StatusFound)
	})
	s := startServer(t, "127.0.0.2", true, hostRouter(mux))
	internal := startServer(t, "127.0.0.1", true, text(`{"id":"did:web:internal.example.com"}`))
	r := &fakeResolver{hosts: map[string][]netip.Addr{"internal.example.com": addrs("127.0.0.1")}}
	ports := map[string]string{"internal.example.com:443": internal.port()}
	for _, n := range []string{"feed", "liar", "junk", "moved", "absent"} {
		r.hosts[n+".example.com"] = addrs("127.0.0.2")
		ports[n+".example.com:443"] = s.port()
	}
	web := newTestClient(t, Config{RootCAs: s.pool(), Resolver: r, AllowCIDRs: prefixes("127.0.0.2/32")}, ports)
	dir := NewDirectory(DirectoryConfig{PLCURL: "http://plc.invalid"}, web)
	ctx := context.Background()

	doc, err := dir.ResolveDID(ctx, "did:web:feed.example.com")
	require.NoError(t, err)
	ep, ok := ServiceEndpoint(doc, "bsky_fg")
	require.True(t, ok)
	require.Equal(t, "https://feed.example.com", ep)

	for _, did := range []syntax.DID{"did:web:internal.example.com", "did:web:moved.example.com"} {
		_, err = dir.ResolveDID(ctx, did)
		require.ErrorIs(t, err, ErrDIDNotFound, did)
		require.True(t, Refused(err), did)
	}
	internal.requireUntouched(t)
	for _, did := range []syntax.DID{"did:web:absent.example.com", "did:web:nxdomain.example.com",
		"did:web:localhost%3A2583", "did:web:example.com:user:alice", "did:web:pds.localhost"} {
		_, err = dir.ResolveDID(ctx, did)
		require.ErrorIs(t, err, ErrDIDNotFound, did)
	}
	for _, did := range []syntax.DID{"did:web:liar.example.com", "did:web:junk.example.com"} {
		_, err = dir.ResolveDID(ctx, did)
		require.ErrorIs(t, err, ErrDIDResolutionFailed, did)
	}
}

func TestServiceEndpoint(t *testing.T) {
	t.Parallel()
	doc := &identity.DIDDocument{
		DID: "did:web:api.example.com",
		Service: []identity.DocService{
			{ID: "#bsky_appview", ServiceEndpoint: "https://api.example.com"},
			{ID: "did:web:api.example.com#bsky_notif", ServiceEndpoint: "https://notif.example.com/base"},
			{ID: "did:web:other.example.com#bsky_chat", ServiceEndpoint: "https://chat.example.com"},
			{ID: "#atproto_labeler", ServiceEndpoint: "not a url"},
			{ID: "#atproto_labeler", ServiceEndpoint: "https://second.example.com"},
			{ID: "#ftp", ServiceEndpoint: "ftp://files.example.com"},
			{ID: "#dev", ServiceEndpoint: "http://localhost:2584"},
		},
	}
	cases := []struct {
		id, want string
	}{
		{"bsky_appview", "https://api.example.com"},
		{"#bsky_appview", "https://api.example.com"},
		{"bsky_notif", "https://notif.example.com/base"},
		{"#dev", "http://localhost:2584"},
		{"bsky_chat", ""},       // another DID's entry
		{"atproto_labeler", ""}, // the first entry decides
		{"ftp", ""},
		{"missing", ""},
		{"", ""},
	}
	for _, c := range cases {
		got, ok := ServiceEndpoint(doc, c.id)
		require.Equal(t, c.want, got, c.id)
		require.Equal(t, c.want != "", ok, c.id)
	}
	_, ok := ServiceEndpoint(nil, "x")
	require.False(t, ok)
}

// did:web:localhost, with a port written %3A, is fetched over plain http
// as the reference implementation fetches it, and only where the guard
// lets loopback through; other ports, paths and spellings are not
// did:webs atproto resolves.
func TestDirectoryDIDWebLocalhost(t *testing.T) {
	t.Parallel()
	var doc atomic.Value
	s := startServer(t, "127.0.0.1", false, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/did.json" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(doc.Load().(string)))
	}))
	did := syntax.DID("did:web:localhost%3A" + s.port())
	doc.Store(`{"id":"` + did.String() + `","service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":"https://one.example.com"}]}`)
	r := &fakeResolver{hosts: map[string][]netip.Addr{"localhost": addrs("127.0.0.1")}}
	ctx := context.Background()

	allowed := NewDirectory(DirectoryConfig{PLCURL: "http://plc.invalid"}, newTestClient(t, Config{Resolver: r, AllowCIDRs: prefixes("127.0.0.0/8")}, nil))
	got, err := allowed.ResolveDID(ctx, did)
	require.NoError(t, err)
	ep, _ := ServiceEndpoint(got, "atproto_pds")
	require.Equal(t, "https://one.example.com", ep)

	// The user edits the document: a lookup may answer from the cache,
	// Refresh fetches it again and the cache follows.
	doc.Store(`{"id":"` + did.String() + `","service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":"https://two.example.com"}]}`)
	got, err = allowed.ResolveDID(ctx, did)
	require.NoError(t, err)
	ep, _ = ServiceEndpoint(got, "atproto_pds")
	require.Equal(t, "https://one.example.com", ep, "cached")
	got, err = allowed.Refresh(ctx, did)
	require.NoError(t, err)
	ep, _ = ServiceEndpoint(got, "atproto_pds")
	require.Equal(t, "https://two.example.com", ep)
	got, err = allowed.ResolveDID(ctx, did)
	require.NoError(t, err)
	ep, _ = ServiceEndpoint(got, "atproto_pds")
	require.Equal(t, "https://two.example.com", ep, "the refreshed document is cached")

	// Without loopback allowed, the guard refuses, and it reads as "not
	// found"; nothing reaches the server.
	before := s.accepts.Load()
	closed := NewDirectory(DirectoryConfig{PLCURL: "http://plc.invalid"}, newTestClient(t, Config{Resolver: r}, nil))
	_, err = closed.ResolveDID(ctx, did)
	require.ErrorIs(t, err, ErrDIDNotFound)
	require.True(t, Refused(err))
	require.Equal(t, before, s.accepts.Load())

	for _, bad := range []syntax.DID{"did:web:localhost%3A0", "did:web:localhost%3A65536", "did:web:localhost%3A080",
		"did:web:localhost%3A", "did:web:example.com%3A8443", "did:web:localhost%3A2583:alice", "did:web:127.0.0.1%3A2583"} {
		_, err := WebDocURL(bad)
		require.ErrorIs(t, err, ErrDIDNotFound, bad)
	}
	for did, want := range map[syntax.DID]string{
		"did:web:localhost":                "http://localhost/.well-known/did.json",
		"did:web:localhost%3a2583":         "http://localhost:2583/.well-known/did.json",
		"did:web:Alice.Example.COM":        "https://alice.example.com/.well-known/did.json",
		"did:plc:ewvi7nxzyoun6zhxrhs64oiz": "",
	} {
		u, err := WebDocURL(did)
		if want == "" {
			require.Error(t, err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, want, u)
	}
}

// A did:web host cannot make the server read more than MaxDIDDocBytes,
// nor hold it past the client's timeout.
func TestDirectoryDIDWebBounds(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	mux := http.NewServeMux()
	mux.HandleFunc("/huge/.well-known/did.json", func(w http.ResponseWriter, r *http.Request) {
		big := make([]byte, MaxDIDDocBytes+1)
		for i := range big {
			big[i] = ' '
		}
		_, _ = w.Write(big)
	})
	mux.HandleFunc("/slow/.well-known/did.json", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	s := startServer(t, "127.0.0.2", true, hostRouter(mux))
	r := &fakeResolver{hosts: map[string][]netip.Addr{}}
	ports := map[string]string{}
	for _, n := range []string{"huge", "slow"} {
		r.hosts[n+".example.com"] = addrs("127.0.0.2")
		ports[n+".example.com:443"] = s.port()
	}
	web := newTestClient(t, Config{RootCAs: s.pool(), Resolver: r, AllowCIDRs: prefixes("127.0.0.2/32"), Timeout: 200 * time.Millisecond}, ports)
	dir := NewDirectory(DirectoryConfig{PLCURL: "http://plc.invalid"}, web)
	for _, did := range []syntax.DID{"did:web:huge.example.com", "did:web:slow.example.com"} {
		_, err := dir.ResolveDID(context.Background(), did)
		require.ErrorIs(t, err, ErrDIDResolutionFailed, did)
	}
}
