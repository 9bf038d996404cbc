package oauth_test

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/oauth/oauthtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testAccounts is the Accounts seam the integrator implements over the
// account package, reduced to what the flow needs: rows in the real
// accounts table (the OAuth tables reference it) and a password each.
type testAccounts struct {
	mu        sync.Mutex
	byID      map[string]*testAccount
	byDID     map[syntax.DID]*testAccount
	logins    int
	rateLimit bool
	busy      bool
}

type testAccount struct {
	acct     oauth.Account
	password string
	gone     bool
	// signInCode, when set, is the code the account's sign-in needs (the
	// email factor), usable once; codeExpired makes it lapsed; mailed
	// counts the codes "sent".
	signInCode  string
	codeExpired bool
	mailed      int
}

func (a *testAccounts) Login(ctx context.Context, identifier, password, code string) (oauth.Account, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.logins++
	if a.rateLimit {
		return oauth.Account{}, oauth.ErrRateLimited
	}
	if a.busy {
		return oauth.Account{}, fmt.Errorf("%w: the password queue is full", oauth.ErrBusy)
	}
	ta, ok := a.byID[strings.ToLower(identifier)]
	if !ok || subtle.ConstantTimeCompare([]byte(ta.password), []byte(password)) != 1 {
		return oauth.Account{}, oauth.ErrLoginFailed
	}
	if ta.gone {
		return oauth.Account{}, oauth.ErrAccountUnavailable
	}
	switch {
	case ta.signInCode == "":
	case code == "":
		ta.mailed++
		return oauth.Account{}, oauth.ErrCodeRequired
	case code != ta.signInCode:
		return oauth.Account{}, oauth.ErrCodeInvalid
	case ta.codeExpired:
		return oauth.Account{}, oauth.ErrCodeExpired
	default:
		ta.signInCode = "used"
	}
	return ta.acct, nil
}

func (a *testAccounts) Get(ctx context.Context, did syntax.DID) (oauth.Account, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ta, ok := a.byDID[did]
	if !ok || ta.gone {
		return oauth.Account{}, oauth.ErrAccountUnavailable
	}
	return ta.acct, nil
}

// fixture is a running authorization server over TLS, which also serves
// client metadata documents, a callback path and a test resource.
type fixture struct {
	t        *testing.T
	srv      *httptest.Server
	mux      *http.ServeMux
	oauth    *oauth.Server
	pool     *pgxpool.Pool
	accounts *testAccounts
	dir      *identity.MockDirectory
	mu       sync.Mutex
	docs     map[string]any // client metadata / JWKS by path
}

type fixtureOpts struct {
	strictClientIDs bool
	configure       func(*oauth.Config)
}

func setup(t *testing.T, opts ...fixtureOpts) *fixture {
	t.Helper()
	var o fixtureOpts
	if len(opts) > 0 {
		o = opts[0]
	}
	pool := dbtest.New(t)
	f := &fixture{t: t, accounts: &testAccounts{byID: map[string]*testAccount{}, byDID: map[syntax.DID]*testAccount{}},
		dir: identity.NewMockDirectory(), docs: map[string]any{}}
	mux := http.NewServeMux()
	f.mux = mux
	f.srv = httptest.NewUnstartedServer(mux)
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	cfg := oauth.Config{
		Issuer: f.srv.URL, Pool: pool, Accounts: f.accounts, Secret: []byte(strings.Repeat("s", 32)),
		HTTPClient: f.srv.Client(), AllowPrivateClientIDs: !o.strictClientIDs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if o.configure != nil {
		o.configure(&cfg)
	}
	s, err := oauth.New(cfg)
	require.NoError(t, err)
	f.oauth = s
	f.pool = pool
	s.Routes(mux)
	mux.HandleFunc("GET /client/", f.serveDoc)
	mux.HandleFunc("GET /callback", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/xrpc/test.resource", f.serveResource)

	for _, a := range []struct{ did, handle, pw string }{
		{"did:plc:alice0000000000000000000", "alice.test", "alice password"},
		{"did:plc:bob00000000000000000000a", "bob.test", "bob password"},
	} {
		f.addAccount(pool, a.did, a.handle, a.pw)
	}
	return f
}

func (f *fixture) addAccount(pool *pgxpool.Pool, did, handle, pw string) {
	_, err := pool.Exec(context.Background(), "INSERT INTO accounts (did, handle, password_hash, signing_key) VALUES ($1, $2, 'x', '\\x00')", did, handle)
	require.NoError(f.t, err)
	ta := &testAccount{acct: oauth.Account{DID: syntax.DID(did), Handle: handle}, password: pw}
	f.accounts.mu.Lock()
	defer f.accounts.mu.Unlock()
	f.accounts.byID[handle] = ta
	f.accounts.byID[did] = ta
	f.accounts.byDID[syntax.DID(did)] = ta
	f.dir.Insert(identity.Identity{
		DID: syntax.DID(did), Handle: syntax.Handle(handle), AlsoKnownAs: []string{"at://" + handle},
		Services: map[string]identity.ServiceEndpoint{"atproto_pds": {Type: "AtprotoPersonalDataServer", URL: f.srv.URL}},
	})
}

// serveDoc serves a registered JSON document (client metadata or JWKS).
func (f *fixture) serveDoc(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	doc, ok := f.docs[r.URL.Path]
	f.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	if raw, ok := doc.(rawDoc); ok {
		for k, v := range raw.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(raw.status)
		_, _ = w.Write(raw.body)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(doc)
}

// rawDoc is a hand-made response for the fetch-limit tests.
type rawDoc struct {
	status int
	header map[string]string
	body   []byte
}

func (f *fixture) putDoc(path string, doc any) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.docs[path] = doc
	return f.srv.URL + path
}

// serveResource is an XRPC-like endpoint that authenticates the request
// and, when asked, checks one permission.
func (f *fixture) serveResource(w http.ResponseWriter, r *http.Request) {
	info, err := f.oauth.Authenticate(r)
	if errors.Is(err, oauth.ErrNotOAuth) {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if err != nil {
		f.oauth.WriteAuthError(w, err)
		return
	}
	w.Header().Set("DPoP-Nonce", f.oauth.DPoPNonce())
	q := r.URL.Query()
	allowed := true
	switch q.Get("check") {
	case "repo":
		allowed = info.CanRepo(q.Get("collection"), q.Get("action"))
	case "blob":
		allowed = info.CanBlob(q.Get("mime"))
	case "rpc":
		allowed = info.CanRPC(q.Get("lxm"), q.Get("aud"))
	}
	if !allowed {
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "ScopeMissing"})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"did": string(info.DID), "client_id": info.ClientID, "scope": info.Scope()})
}

// publicClient registers a public client's metadata and returns an indigo
// client app for it.
func (f *fixture) publicClient(name string, scopes []string) *indigo.ClientApp {
	cfg := indigo.NewPublicConfig(f.srv.URL+"/client/"+name+".json", f.srv.URL+"/callback", scopes)
	f.putDoc("/client/"+name+".json", cfg.ClientMetadata())
	return f.clientApp(&cfg)
}

func (f *fixture) clientApp(cfg *indigo.ClientConfig) *indigo.ClientApp {
	app := indigo.NewClientApp(cfg, indigo.NewMemStore())
	app.Client = f.srv.Client()
	app.Dir = f.dir
	return app
}

// asMetadata fetches our metadata as indigo's type.
func (f *fixture) asMetadata() *indigo.AuthServerMetadata {
	resp, err := f.srv.Client().Get(f.srv.URL + oauth.PathASMetadata)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	require.Equal(f.t, http.StatusOK, resp.StatusCode)
	var md indigo.AuthServerMetadata
	require.NoError(f.t, json.NewDecoder(resp.Body).Decode(&md))
	return &md
}

// browser is a person's browser on the fixture's server.
func (f *fixture) browser() *oauthtest.Browser {
	return oauthtest.NewBrowser(f.t, f.srv.URL, f.srv.Client())
}
