package pds

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/devdns"
	"github.com/bulwark-pds/bulwark/outbound"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// webWorld is the web did:webs live on: a DNS server (an A record for
// every name it plays, and the _atproto TXT records a test sets) and an
// HTTPS server on 127.0.0.1 answering https://<name>/.well-known/did.json
// with the document the test publishes for that name. The servers under
// test reach it through an outbound client that may reach 127.0.0.1 only
// (as --proxy-allow-private allows), so 127.0.0.2 stands for a private
// address nobody allowed.
type webWorld struct {
	dns *devdns.Server
	// client is the outbound client the servers under test use.
	client *outbound.Client
	// private serves on 127.0.0.2; it must never be reached.
	private *httptest.Server
	// privateHits counts its requests.
	mu          sync.Mutex
	docs        map[string][]byte
	asked       map[string]int
	privateHits int
	// slow holds the answers to slow.example.com until the test ends.
	slow chan struct{}
}

// webNames are the names the world plays. huge answers a document over
// the size limit, slow never answers, redirect sends to the private
// server.
var webNames = []string{"alice.example.com", "bob.example.com", "carol.example.com", "dave.example.com",
	"erin.example.com", "huge.example.com", "slow.example.com", "redirect.example.com"}

func newWebWorld(t *testing.T) *webWorld {
	t.Helper()
	w := &webWorld{dns: startDNS(t), docs: map[string][]byte{}, asked: map[string]int{}, slow: make(chan struct{})}
	t.Cleanup(func() { close(w.slow) })
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	w.private = httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.privateHits++
		w.mu.Unlock()
		_, _ = rw.Write([]byte(`{"id":"did:web:redirect.example.com"}`))
	}))
	w.private.Listener.Close()
	w.private.Listener = ln
	w.private.Start()
	t.Cleanup(w.private.Close)
	web := httptest.NewTLSServer(http.HandlerFunc(w.serve))
	t.Cleanup(web.Close)
	roots := x509.NewCertPool()
	roots.AddCert(web.Certificate())
	port := strconv.Itoa(web.Listener.Addr().(*net.TCPAddr).Port)
	ports := map[string]string{}
	for _, n := range webNames {
		w.dns.SetAddr(n, netip.MustParseAddr("127.0.0.1"))
		ports[n+":443"] = port
	}
	w.client = outbound.New(outbound.Config{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Resolver:   w.dns.Resolver(), RootCAs: roots, DialPorts: ports,
		// Bounds a did:web host that never answers, as the server's
		// outbound timeout does.
		Timeout: 2 * time.Second,
	})
	t.Cleanup(w.client.CloseIdleConnections)
	return w
}

func (w *webWorld) serve(rw http.ResponseWriter, r *http.Request) {
	host, _, _ := net.SplitHostPort(r.Host)
	if host == "" {
		host = r.Host
	}
	w.mu.Lock()
	doc, ok := w.docs[host]
	w.asked[host]++
	w.mu.Unlock()
	switch {
	case r.URL.Path != "/.well-known/did.json":
		http.NotFound(rw, r)
	case host == "huge.example.com":
		big := make([]byte, outbound.MaxDIDDocBytes+1)
		for i := range big {
			big[i] = ' '
		}
		_, _ = rw.Write(big)
	case host == "slow.example.com":
		select {
		case <-w.slow:
		case <-r.Context().Done():
			panic(http.ErrAbortHandler) // no answer racing the caller's give-up
		}
	case host == "redirect.example.com":
		http.Redirect(rw, r, w.private.URL+"/.well-known/did.json", http.StatusFound)
	case !ok:
		http.NotFound(rw, r)
	default:
		rw.Header().Set("Content-Type", "application/did+ld+json")
		_, _ = rw.Write(doc)
	}
}

// publish makes doc what https://<host>/.well-known/did.json answers.
func (w *webWorld) publish(t *testing.T, host string, doc map[string]any) {
	t.Helper()
	b, err := json.Marshal(doc)
	require.NoError(t, err)
	w.mu.Lock()
	w.docs[host] = b
	w.mu.Unlock()
}

// privateRequests is how many requests reached the private server.
func (w *webWorld) privateRequests() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.privateHits
}

// webIdentity is a did:web whose document the test (its holder) writes.
type webIdentity struct {
	did    syntax.DID
	host   string
	handle string
	// key is the holder's own signing key, named by the document until a
	// server's key replaces it.
	key atcrypto.PrivateKey
}

// identity is the did:web of host, its handle host itself (a _atproto
// TXT record names the DID).
func (w *webWorld) identity(t *testing.T, host string) *webIdentity {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	id := &webIdentity{did: syntax.DID("did:web:" + host), host: host, handle: host, key: key}
	w.dns.SetTXT("_atproto."+host, "did="+id.did.String())
	return id
}

// didDoc is a did:web document naming pds as the account's PDS, signingKey
// (a did:key) as its atproto key and handle first in alsoKnownAs.
func didDoc(did syntax.DID, handle, pds, signingKey string) map[string]any {
	pub, err := atcrypto.ParsePublicDIDKey(signingKey)
	if err != nil {
		panic(err)
	}
	return map[string]any{
		"@context":    []string{"https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"},
		"id":          did.String(),
		"alsoKnownAs": []string{"at://" + handle},
		"verificationMethod": []map[string]any{{
			"id": did.String() + "#atproto", "type": "Multikey", "controller": did.String(), "publicKeyMultibase": pub.Multibase(),
		}},
		"service": []map[string]any{{"id": "#atproto_pds", "type": "AtprotoPersonalDataServer", "serviceEndpoint": pds}},
	}
}

// publishSelf publishes id's document with its own key, naming pds.
func (w *webWorld) publishSelf(t *testing.T, id *webIdentity, pds string) {
	t.Helper()
	pub, err := id.key.PublicKey()
	require.NoError(t, err)
	w.publish(t, id.host, didDoc(id.did, id.handle, pds, pub.DIDKey()))
}

// selfToken is a createAccount service-auth JWT for aud signed by id's own
// key (a holder hosting nowhere yet).
func (id *webIdentity) selfToken(t *testing.T, aud string) string {
	t.Helper()
	lxm := syntax.NSID(createAccountNSID)
	token, err := auth.SignServiceAuth(id.did, aud, time.Minute, &lxm, id.key)
	require.NoError(t, err)
	return token
}

// webEnv is a server whose outbound client reaches w.
func (w *webWorld) env(t *testing.T, plc http.Handler) *accountEnv {
	t.Helper()
	return newAccountEnv(t, envOptions{plcHandler: plc, blobs: true, options: func(o *Options) { o.Outbound = w.client }})
}

// webPair is a movePair whose servers reach the web world, with a
// directory that reads did:web documents afresh each time.
func newWebMovePair(t *testing.T, w *webWorld) *movePair {
	t.Helper()
	p := &movePair{plc: plctest.New()}
	withWeb := func(o *Options) { o.Outbound = w.client }
	p.a = newMoveServerWith(t, "a", p.plc, withWeb)
	p.b = newMoveServerWith(t, "b", p.plc, withWeb)
	p.dir = outbound.NewDirectory(outbound.DirectoryConfig{PLCURL: p.a.plcURL, CacheTTL: time.Nanosecond, SkipHandleVerification: true}, w.client)
	return p
}

// createWebAccount brings id, hosted nowhere yet (its document names
// elsewhere and its own key), to e as the holder does: createAccount with
// a service-auth JWT it signs itself, then the document pointed at e with
// e's recommended key, then activateAccount. It returns the active
// account's session on e.
func (w *webWorld) createWebAccount(t *testing.T, e *accountEnv, id *webIdentity, password string) *user {
	t.Helper()
	w.publishSelf(t, id, "https://elsewhere.example.com")
	res := e.post(t, "com.atproto.server.createAccount", id.selfToken(t, e.cfg.ServiceDID()), map[string]any{
		"did": id.did, "handle": id.handle, "email": "web-" + id.host + "@example.com", "password": password,
	}).ok(t)
	u := &user{did: id.did, handle: id.handle, pass: password, access: res.str(t, "accessJwt"), refresh: res.str(t, "refreshJwt")}
	e.post(t, "com.atproto.server.activateAccount", u.access, nil).fails(t, http.StatusBadRequest, "InvalidRequest")
	w.pointAt(t, e, u, id)
	e.post(t, "com.atproto.server.activateAccount", u.access, nil).ok(t)
	return u
}

// pointAt publishes id's document as e recommends it for u: e's URL and
// the account's key there.
func (w *webWorld) pointAt(t *testing.T, e *accountEnv, u *user, id *webIdentity) {
	t.Helper()
	creds := e.recommended(t, u)
	key := creds["verificationMethods"].(map[string]any)["atproto"].(string)
	pds := creds["services"].(map[string]any)["atproto_pds"].(map[string]any)["endpoint"].(string)
	w.publish(t, id.host, didDoc(id.did, id.handle, pds, key))
}

// movedAwayAt is accounts.moved_away_at of did on e (nil: not marked).
func (e *accountEnv) movedAwayAt(t *testing.T, did syntax.DID) *time.Time {
	t.Helper()
	var at *time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT moved_away_at FROM accounts WHERE did = $1", did.String()).Scan(&at))
	return at
}
