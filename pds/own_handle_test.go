package pds

import (
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/devdns"
	"github.com/bulwark-pds/bulwark/outbound"
)

// handleWorld is the internet a handle of the user's own lives on: a DNS
// server (TXT _atproto records, A records) and an HTTPS server answering
// /.well-known/atproto-did for every *.example.com name, both on loopback,
// which the server's outbound client may reach as --proxy-allow-private
// allows.
type handleWorld struct {
	dns *devdns.Server
	mu  sync.Mutex
	// wellKnown is what https://<host>/.well-known/atproto-did answers.
	wellKnown map[string]string
	requests  map[string]int
}

// webHandles are the names the HTTPS server plays.
var webHandles = []string{"web.example.com", "moved.example.com", "nothing.example.com"}

func newHandleWorld(t *testing.T) (*accountEnv, *handleWorld) {
	t.Helper()
	w := &handleWorld{dns: startDNS(t), wellKnown: map[string]string{}, requests: map[string]int{}}
	web := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		body, ok := w.wellKnown[r.Host]
		w.requests[r.Host]++
		w.mu.Unlock()
		if !ok || r.URL.Path != "/.well-known/atproto-did" {
			http.NotFound(rw, r)
			return
		}
		_, _ = rw.Write([]byte(body))
	}))
	t.Cleanup(web.Close)
	roots := x509.NewCertPool()
	roots.AddCert(web.Certificate())
	ports := map[string]string{}
	port := web.Listener.Addr().(interface{ String() string }).String()
	port = port[strings.LastIndex(port, ":")+1:]
	for _, h := range webHandles {
		w.dns.SetAddr(h, netip.MustParseAddr("127.0.0.1"))
		ports[h+":443"] = port
	}
	client := outbound.New(outbound.Config{
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Resolver:   w.dns.Resolver(), RootCAs: roots, DialPorts: ports,
	})
	t.Cleanup(client.CloseIdleConnections)
	e := newAccountEnv(t, envOptions{options: func(o *Options) { o.Outbound = client }})
	return e, w
}

func (w *handleWorld) serve(host, body string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wellKnown[host] = body
}

func (w *handleWorld) asked(host string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.requests[host]
}

// updateHandle accepts a domain of the user's own that resolves to the
// account's DID now (DNS TXT, or the HTTPS well-known), as the reference
// PDS does: the DID document names it, an #identity event announces it,
// and the server answers for it.
func TestUpdateHandleOwnDomain(t *testing.T) {
	t.Parallel()
	e, w := newHandleWorld(t)
	u := e.createUser(t)
	const nsid = "com.atproto.identity.updateHandle"

	// DNS TXT, given in any case.
	w.dns.SetTXT("_atproto.alice.example.org", "v=spf1 -all", "did="+u.did.String())
	e.post(t, nsid, u.access, map[string]any{"handle": "Alice.Example.ORG"}).ok(t)
	requireHandle(t, e, u, "alice.example.org")

	// The HTTPS well-known.
	w.serve("web.example.com", u.did.String()+"\n")
	e.post(t, nsid, u.access, map[string]any{"handle": "web.example.com"}).ok(t)
	requireHandle(t, e, u, "web.example.com")
	require.Equal(t, 1, w.asked("web.example.com"), "no TXT record: the well-known was asked")

	// Back to a handle of the server's: no lookup at all.
	e.post(t, nsid, u.access, map[string]any{"handle": "back.test"}).ok(t)
	requireHandle(t, e, u, "back.test")
}

func requireHandle(t *testing.T, e *accountEnv, u *user, handle string) {
	t.Helper()
	require.Equal(t, handle, e.get(t, "com.atproto.server.getSession", u.access, nil).ok(t).str(t, "handle"))
	log := e.plc.Log(u.did.String())
	require.Equal(t, []string{"at://" + handle}, log[len(log)-1].Operation.Regular.AlsoKnownAs)
	kinds := e.eventKinds(t, u.did)
	require.Equal(t, "identity", kinds[len(kinds)-1])
	require.Equal(t, u.did.String(), e.get(t, "com.atproto.identity.resolveHandle", "", map[string][]string{"handle": {handle}}).ok(t).str(t, "did"))
}

// A domain that does not point to the caller is refused with the
// reference PDS's error and changes nothing: squatting someone else's
// domain, a domain with no record, two DIDs in TXT, names that are not
// handles.
func TestUpdateHandleOwnDomainRefusals(t *testing.T) {
	t.Parallel()
	e, w := newHandleWorld(t)
	alice, mallory := e.createUser(t), e.createUser(t)
	const nsid = "com.atproto.identity.updateHandle"
	w.dns.SetTXT("_atproto.alice.example.org", "did="+alice.did.String())
	w.dns.SetTXT("_atproto.twice.example.org", "did="+alice.did.String(), "did="+mallory.did.String())
	w.serve("web.example.com", alice.did.String())
	w.serve("nothing.example.com", "not a did")

	before, plcOps := e.rowCounts(t), e.plc.Count()
	refused := map[string]string{
		"alice.example.org":                       "InvalidRequest", // names alice
		"web.example.com":                         "InvalidRequest", // the well-known names alice
		"nobody.example.org":                      "InvalidRequest", // no record anywhere
		"twice.example.org":                       "InvalidRequest", // two DIDs
		"nothing.example.com":                     "InvalidRequest", // not a DID
		"alice.example.org.":                      "InvalidHandle",  // trailing dot
		"ålice.example.org":                       "InvalidHandle",  // not ASCII
		"alice.local":                             "InvalidHandle",  // reserved TLD, never looked up
		"alice..example.org":                      "InvalidHandle",
		"a.b.test":                                "InvalidHandle", // under the server's domain: its rules
		strings.Repeat("a", 250) + ".example.org": "InvalidHandle",
	}
	for h, name := range refused {
		msg := e.post(t, nsid, mallory.access, map[string]any{"handle": h}).fails(t, http.StatusBadRequest, name)
		if name == "InvalidRequest" {
			require.Contains(t, msg, "External handle did not resolve to DID", h)
		}
	}
	require.Equal(t, before, e.rowCounts(t))
	require.Equal(t, plcOps, e.plc.Count(), "nothing was sent to the PLC directory")
	require.Equal(t, 0, w.asked("alice.local"))

	// The owner takes it; then the domain moves to mallory, who is still
	// refused while alice holds it (as in the reference PDS).
	e.post(t, nsid, alice.access, map[string]any{"handle": "alice.example.org"}).ok(t)
	w.dns.SetTXT("_atproto.alice.example.org", "did="+mallory.did.String())
	e.post(t, nsid, mallory.access, map[string]any{"handle": "alice.example.org"}).fails(t, http.StatusBadRequest, "HandleNotAvailable")
	// A handle checked when set, not forever: alice may set it again
	// only while it resolves to her.
	e.post(t, nsid, alice.access, map[string]any{"handle": "alice.example.org"}).fails(t, http.StatusBadRequest, "InvalidRequest")
}

// Two accounts racing for one domain: the one it names gets it, the other
// is refused, however the requests interleave.
func TestUpdateHandleOwnDomainRace(t *testing.T) {
	t.Parallel()
	e, w := newHandleWorld(t)
	a, b := e.createUser(t), e.createUser(t)
	w.dns.SetTXT("_atproto.race.example.org", "did="+a.did.String())
	var wg sync.WaitGroup
	results := make([]xrpcResult, 8)
	for i := range results {
		u := a
		if i%2 == 1 {
			u = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = e.post(t, "com.atproto.identity.updateHandle", u.access, map[string]any{"handle": "race.example.org"})
		}()
	}
	wg.Wait()
	for i, r := range results {
		if i%2 == 0 {
			require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		} else {
			require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
		}
	}
	got, err := e.accounts.GetByHandle(t.Context(), syntax.Handle("race.example.org"))
	require.NoError(t, err)
	require.Equal(t, a.did, got.DID)
}

// startDNS starts a DNS server on a loopback port for the test.
func startDNS(t *testing.T) *devdns.Server {
	t.Helper()
	s, err := devdns.Start("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}
