package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

const (
	appViewDID syntax.DID = "did:web:appview.test"
	modDID     syntax.DID = "did:plc:moderation0000000000000"
	reportDID  syntax.DID = "did:plc:reports000000000000000"
	callerDID  syntax.DID = "did:plc:caller00000000000000000"
	chatDID    syntax.DID = "did:web:chat.test"
)

// upstream is an in-process fake service that counts its requests.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// jsonOK answers body as JSON.
func jsonOK(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}
}

// front is an HTTP server that does what the XRPC layer will: parse the
// NSID, call Serve with the caller it is told, answer errors as XRPC.
type front struct {
	*httptest.Server
	p *Proxy

	mu     sync.Mutex
	caller Caller
}

func newFront(t *testing.T, cfg Config, c Caller) *front {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p, err := New(cfg)
	require.NoError(t, err)
	f := &front{p: p, caller: c}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nsid, err := syntax.ParseNSID(strings.TrimPrefix(r.URL.Path, "/xrpc/"))
		if err != nil {
			http.Error(w, "bad nsid", http.StatusNotFound)
			return
		}
		f.mu.Lock()
		c := f.caller
		f.mu.Unlock()
		if err := p.Serve(w, r, nsid, c); err != nil {
			writeXRPCError(w, err)
		}
	}))
	// The client sends exactly the headers a test sets (no automatic
	// Accept-Encoding) and shows bodies as they came.
	f.Client().Transport.(*http.Transport).DisableCompression = true
	t.Cleanup(f.Close)
	return f
}

func (f *front) setCaller(c Caller) {
	f.mu.Lock()
	f.caller = c
	f.mu.Unlock()
}

func writeXRPCError(w http.ResponseWriter, err error) {
	var pe *Error
	if !errors.As(err, &pe) {
		pe = &Error{Status: 500, Name: "InternalServerError", Message: "unexpected"}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(pe.Status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": pe.Name, "message": pe.Message})
}

// result is a finished client exchange.
type result struct {
	status int
	header http.Header
	body   string
	err    map[string]string // decoded XRPC error, if any
}

func (f *front) get(t *testing.T, nsid string, hdr map[string]string) result {
	t.Helper()
	return f.do(t, http.MethodGet, nsid, nil, hdr)
}

func (f *front) do(t *testing.T, method, path string, body io.Reader, hdr map[string]string) result {
	t.Helper()
	req, err := http.NewRequest(method, f.URL+"/xrpc/"+path, body)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	res := result{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if resp.StatusCode >= 400 {
		_ = json.Unmarshal(b, &res.err)
	}
	return res
}

// keys is a KeySource over a fixed set of accounts.
type keys map[syntax.DID]atcrypto.PrivateKey

func (k keys) SigningKey(_ context.Context, did syntax.DID) (atcrypto.PrivateKey, error) {
	if key, ok := k[did]; ok {
		return key, nil
	}
	return nil, errors.New("no key for account")
}

// account makes a signing key for did and a directory that serves its DID
// document, as the service receiving the token would resolve it.
func account(t *testing.T, did syntax.DID) (keys, *identity.MockDirectory) {
	t.Helper()
	priv, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	pub, err := priv.PublicKey()
	require.NoError(t, err)
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{
		DID:    did,
		Handle: syntax.HandleInvalid,
		Keys: map[string]identity.VerificationMethod{
			"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()},
		},
	})
	return keys{did: priv}, dir
}

// stubResolver maps DIDs to service endpoints and counts lookups.
type stubResolver struct {
	services map[syntax.DID]map[string]string
	calls    atomic.Int64
}

func (s *stubResolver) ResolveService(_ context.Context, did syntax.DID, id string) (string, error) {
	s.calls.Add(1)
	svcs, ok := s.services[did]
	if !ok {
		return "", newError(ErrUnknownDID, nil, "could not resolve proxy DID %s", did)
	}
	u, ok := svcs[id]
	if !ok {
		return "", newError(ErrUnknownService, nil, "DID %s has no service #%s", did, id)
	}
	return u, nil
}

var authed = Caller{DID: callerDID, Authenticated: true}
