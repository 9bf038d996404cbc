package oauth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/internal/keyring"
	"github.com/bulwark-pds/bulwark/oauth/dpop"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// Lifetimes, as the atproto OAuth profile recommends them.
const (
	// DefaultAccessTTL: the profile asks for under 30 minutes; access tokens
	// are also checked against their grant on every use (see Authenticate),
	// so a revoked grant stops working at once.
	DefaultAccessTTL = 15 * time.Minute
	// DefaultPublicSessionTTL bounds a public client's whole session (and
	// so each of its refresh tokens): 2 weeks in the profile.
	DefaultPublicSessionTTL = 14 * 24 * time.Hour
	// DefaultConfidentialRefreshTTL is a confidential client's refresh
	// token lifetime: 180 days; its session has no overall limit.
	DefaultConfidentialRefreshTTL = 180 * 24 * time.Hour
	// RequestTTL is how long a pushed request waits for the browser.
	RequestTTL = 5 * time.Minute
	// InteractionTTL is how long an opened request stays valid while the
	// person signs in and decides.
	InteractionTTL = 15 * time.Minute
	// CodeTTL is how long an authorization code may wait for the token
	// request.
	CodeTTL = time.Minute
	// DefaultSignInTTL is how long an account stays signed in on a
	// browser; the browser is remembered (an oauth_devices row) only while
	// an account is signed in on it.
	DefaultSignInTTL = 30 * 24 * time.Hour
)

// Bounds on what clients can make the server store.
const (
	// DefaultMaxPendingRequests bounds the pushed requests not yet
	// approved, over all clients: at most this many rows wait for a
	// browser, whatever the number of clients and addresses.
	DefaultMaxPendingRequests = 10_000
	// DefaultMaxPendingPerClient bounds one client_id's pushed requests not
	// yet approved, so that one app cannot take the whole allowance.
	DefaultMaxPendingPerClient = 1_000
	// DefaultMaxUsedValues bounds the remembered PKCE challenges and states.
	// Past it the oldest are forgotten first: under a flood a challenge may
	// be accepted again sooner than a day after its first use.
	DefaultMaxUsedValues = 100_000
	// maxDevicesPerAccount bounds the browsers an account is remembered on;
	// signing in on one more forgets the longest-signed-in.
	maxDevicesPerAccount = 32
	// maxGrantsPerClient bounds an app's grants of one account (one per
	// device it signed in on, typically); a newer one ends the oldest.
	maxGrantsPerClient = 20
	// maxSpentPerGrant bounds the spent refresh tokens remembered per
	// grant (to revoke it when one comes back); the oldest are forgotten.
	maxSpentPerGrant = 64
)

// Endpoint paths under the issuer.
const (
	PathASMetadata = "/.well-known/oauth-authorization-server"
	PathRSMetadata = "/.well-known/oauth-protected-resource"
	PathPAR        = "/oauth/par"
	PathAuthorize  = "/oauth/authorize"
	PathToken      = "/oauth/token"
	PathRevoke     = "/oauth/revoke"
	PathAccount    = "/oauth/account"
	PathStyle      = "/oauth/static/style.css"
)

// Config configures a Server. Fields marked required must be set; the
// zero value of every other field works.
type Config struct {
	// Issuer is the server's public base URL, e.g. https://pds.example.com
	// (the PDS URL: this server is both authorization and resource
	// server). No path. http is accepted for local development; browser
	// cookies then lose the Secure flag. Required.
	Issuer string
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Accounts signs people in and looks accounts up. Required.
	Accounts Accounts
	// Secret (at least 32 bytes) keys access tokens (HS256), DPoP nonces
	// and CSRF tokens, each through its own key derived by package
	// keyring, so passing the server's session-token secret is fine. Every node behind one
	// issuer needs the same value. Required.
	Secret []byte
	// HTTPClient fetches client metadata documents and JWKS. Pass the
	// SSRF-guarded outbound client (public unicast addresses only, bounded
	// time); this package adds its own size limit and time bound and
	// refuses redirects. nil means a plain client with a 10 s timeout,
	// which guards nothing: for tests only.
	HTTPClient *http.Client
	// AllowPrivateClientIDs accepts https client_ids that name an IP
	// address, carry a port, or use a local name (localhost, *.local, ...).
	// For tests and development only.
	AllowPrivateClientIDs bool
	// DisableLocalhostClients refuses the http://localhost development
	// clients the profile describes (allowed by default, as the profile
	// encourages).
	DisableLocalhostClients bool
	// TrustedClients are client_ids whose self-declared name may be shown
	// on the consent page; for others only the client_id is shown.
	TrustedClients []string
	// ServerName is shown in page titles; empty means the issuer's host.
	ServerName string
	// AccessTTL is the access-token lifetime; zero means DefaultAccessTTL.
	AccessTTL time.Duration
	// PublicSessionTTL bounds a public client's session; zero means
	// DefaultPublicSessionTTL.
	PublicSessionTTL time.Duration
	// ConfidentialRefreshTTL is a confidential client's refresh-token
	// lifetime; zero means DefaultConfidentialRefreshTTL.
	ConfidentialRefreshTTL time.Duration
	// ClientCacheTTL is how long a fetched client metadata document is
	// used; zero means DefaultClientCacheTTL.
	ClientCacheTTL time.Duration
	// FetchTimeout bounds the fetch of a client's documents; zero means
	// DefaultFetchTimeout.
	FetchTimeout time.Duration
	// Lexicons resolves the permission sets apps ask for (include:
	// scopes), verified (lexresolve.Resolver over the SSRF-guarded
	// outbound client). nil refuses include: scopes with invalid_scope.
	Lexicons LexiconResolver
	// LexiconTimeout bounds one permission set's resolution; zero means
	// DefaultLexiconTimeout.
	LexiconTimeout time.Duration
	// SignInTTL is how long an account stays signed in on a browser; zero
	// means DefaultSignInTTL.
	SignInTTL time.Duration
	// DPoP tunes proof checking (nonce rotation, iat window, replay
	// memory); its Secret and Now are filled in from this Config.
	DPoP dpop.Config
	// Limits are the rate limits of the endpoints
	// (ratelimit.PolicyOAuth*): every route per client address, PAR,
	// token and revocation also per client_id. nil means none (tests
	// that are not about them).
	Limits *ratelimit.Set
	// ClientAddr is the address a request came from, as the rate limits
	// see it (the forwarded address behind a trusted proxy); nil means
	// the TCP peer.
	ClientAddr func(*http.Request) netip.Addr
	// MaxPendingRequests bounds the pushed requests not yet approved, over
	// all clients, and MaxPendingPerClient those of one client_id; zero
	// means DefaultMaxPendingRequests and DefaultMaxPendingPerClient.
	MaxPendingRequests  int
	MaxPendingPerClient int
	// MaxUsedValues bounds the remembered PKCE challenges and states
	// (refused again for a day); zero means DefaultMaxUsedValues.
	MaxUsedValues int
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock for tokens and proofs; nil means time.Now.
	Now func() time.Time
}

// Account is what the pages and tokens need to know about an account.
type Account struct {
	DID syntax.DID
	// Handle may be empty (shown as the DID).
	Handle string
}

// Accounts is implemented by the integrator over its account store.
type Accounts interface {
	// Login checks an identifier (handle, email or DID) and the account's
	// own password (never an app password) and returns the account. Wrong
	// credentials: an error wrapping ErrLoginFailed; too many attempts: one
	// wrapping ErrRateLimited (rate limits are the implementation's job);
	// an account that may not sign in (taken down): ErrAccountUnavailable;
	// no password check possible now (a full queue): one wrapping ErrBusy.
	//
	// An account that signs in with a code mailed to it as well (the email
	// sign-in factor) also needs code, once the password is right: without
	// one ("") the implementation mails one (as its session login does,
	// with the same limits) and returns an error wrapping ErrCodeRequired;
	// a wrong or used code: ErrCodeInvalid; a lapsed one: ErrCodeExpired.
	// A wrong password says nothing about codes and mails nothing.
	Login(ctx context.Context, identifier, password, code string) (Account, error)
	// Get returns an account that may use OAuth, or an error wrapping
	// ErrAccountUnavailable when it is gone or may not (taken down).
	Get(ctx context.Context, did syntax.DID) (Account, error)
}

// Errors an Accounts implementation returns.
var (
	// ErrLoginFailed means the identifier or password is wrong.
	ErrLoginFailed = errors.New("invalid identifier or password")
	// ErrRateLimited means too many sign-in attempts.
	ErrRateLimited = errors.New("too many attempts")
	// ErrAccountUnavailable means the account does not exist or may not
	// use OAuth.
	ErrAccountUnavailable = errors.New("account unavailable")
	// ErrBusy means the password could not be checked now (the server is
	// checking as many as it will): the person is asked to try again in a
	// few seconds.
	ErrBusy = errors.New("too many sign-ins in progress")
	// ErrCodeRequired means the password was right and the account needs
	// the sign-in code just mailed to it.
	ErrCodeRequired = errors.New("a sign-in code sent by email is required")
	// ErrCodeInvalid means the sign-in code is wrong or used.
	ErrCodeInvalid = errors.New("invalid sign-in code")
	// ErrCodeExpired means the sign-in code has lapsed.
	ErrCodeExpired = errors.New("expired sign-in code")
)

// Server is the OAuth authorization server and resource-server verifier.
type Server struct {
	cfg      Config
	db       *pgxpool.Pool
	accounts Accounts
	dpop     *dpop.Verifier
	clients  *clientCache
	sets     *setCache // nil without Config.Lexicons
	tokenKey []byte
	csrfKey  []byte
	secure   bool // cookies get the Secure flag (https issuer)
	log      *slog.Logger
	pages    *pages
	trim     valueTrim
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Pool == nil || cfg.Accounts == nil:
		return nil, errors.New("oauth: Pool and Accounts are required")
	case len(cfg.Secret) < 32:
		return nil, errors.New("oauth: Secret must be at least 32 bytes")
	}
	iss, err := url.Parse(cfg.Issuer)
	if err != nil || (iss.Scheme != "https" && iss.Scheme != "http") || iss.Host == "" ||
		iss.User != nil || (iss.Path != "" && iss.Path != "/") || iss.RawQuery != "" || iss.Fragment != "" {
		return nil, fmt.Errorf("oauth: Issuer %q must be a bare http(s) origin", cfg.Issuer)
	}
	cfg.Issuer = iss.Scheme + "://" + iss.Host
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.AccessTTL <= 0 {
		cfg.AccessTTL = DefaultAccessTTL
	}
	if cfg.PublicSessionTTL <= 0 {
		cfg.PublicSessionTTL = DefaultPublicSessionTTL
	}
	if cfg.ConfidentialRefreshTTL <= 0 {
		cfg.ConfidentialRefreshTTL = DefaultConfidentialRefreshTTL
	}
	if cfg.SignInTTL <= 0 {
		cfg.SignInTTL = DefaultSignInTTL
	}
	if cfg.ServerName == "" {
		cfg.ServerName = iss.Host
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	keys := keyring.MustNew(cfg.Secret)
	dcfg := cfg.DPoP
	dcfg.Secret = cfg.Secret // the verifier derives its nonce key from it
	dcfg.Now = cfg.Now
	pg, err := newPages()
	if err != nil {
		return nil, err
	}
	var sets *setCache
	if cfg.Lexicons != nil {
		sets = newSetCache(&cfg)
	}
	return &Server{
		cfg:      cfg,
		sets:     sets,
		db:       cfg.Pool,
		accounts: cfg.Accounts,
		dpop:     dpop.NewVerifier(dcfg),
		clients:  newClientCache(&cfg),
		tokenKey: keys.Key(keyring.OAuthAccessToken),
		csrfKey:  keys.Key(keyring.OAuthCSRF),
		secure:   iss.Scheme == "https",
		log:      cfg.Logger.With("component", "oauth"),
		pages:    pg,
	}, nil
}

// Issuer is the server's issuer URL.
func (s *Server) Issuer() string { return s.cfg.Issuer }

func (s *Server) endpoint(path string) string { return s.cfg.Issuer + path }

// Routes registers every endpoint on mux: the two metadata documents,
// PAR, authorize (the sign-in and consent pages), token, revoke, the
// account page and the pages' stylesheet. Every route is under a
// per-address rate limit (Config.Limits), checked before anything else.
func (s *Server) Routes(mux Mux) {
	api := func(policy string, h http.HandlerFunc) http.HandlerFunc {
		return s.cors(s.perAddress(policy, false, h))
	}
	page := func(h http.HandlerFunc) http.HandlerFunc { return s.perAddress(ratelimit.PolicyOAuthPage, true, h) }
	mux.HandleFunc("GET "+PathASMetadata, api(ratelimit.PolicyOAuthMetadata, s.handleASMetadata))
	mux.HandleFunc("GET "+PathRSMetadata, api(ratelimit.PolicyOAuthMetadata, s.handleRSMetadata))
	mux.HandleFunc("POST "+PathPAR, api(ratelimit.PolicyOAuthPAR, s.handlePAR))
	mux.HandleFunc("POST "+PathToken, api(ratelimit.PolicyOAuthToken, s.handleToken))
	mux.HandleFunc("POST "+PathRevoke, api(ratelimit.PolicyOAuthToken, s.handleRevoke))
	for _, p := range []string{PathASMetadata, PathRSMetadata, PathPAR, PathToken, PathRevoke} {
		mux.HandleFunc("OPTIONS "+p, api(ratelimit.PolicyOAuthMetadata, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		}))
	}
	mux.HandleFunc("GET "+PathAuthorize, page(s.handleAuthorizeGet))
	mux.HandleFunc("POST "+PathAuthorize, page(s.handleAuthorizePost))
	mux.HandleFunc("GET "+PathAccount, page(s.handleAccountGet))
	mux.HandleFunc("POST "+PathAccount, page(s.handleAccountPost))
	mux.HandleFunc("GET "+PathStyle, s.perAddress(ratelimit.PolicyOAuthMetadata, false, s.handleStyle))
	// Anything else under /oauth/ (a wrong path or method) is answered
	// here, under a limit too.
	mux.HandleFunc("/oauth/", api(ratelimit.PolicyOAuthMetadata, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "not_found", "error_description": "no such OAuth endpoint"})
	}))
}

// Mux is where Routes registers the endpoints (an *http.ServeMux).
type Mux interface {
	HandleFunc(pattern string, handler func(http.ResponseWriter, *http.Request))
}

// Handler is a mux serving only Routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	s.Routes(mux)
	return mux
}

// cors lets browser apps call the JSON endpoints: they carry no cookies,
// so any origin may.
func (s *Server) cors(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Access-Control-Allow-Origin", "*")
		if r.Method == http.MethodOptions {
			hd.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
			hd.Set("Access-Control-Allow-Headers", "Content-Type, Authorization, DPoP")
			hd.Set("Access-Control-Max-Age", "600")
		}
		hd.Set("Access-Control-Expose-Headers", "DPoP-Nonce, WWW-Authenticate")
		h(w, r)
	}
}

// Run deletes expired state every interval (5 minutes when zero) until
// ctx ends.
func (s *Server) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 5 * time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Cleanup(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("cleanup failed", "err", err)
			}
		}
	}
}

// DPoPNonce is the current DPoP nonce. Resource-server responses to DPoP
// requests should carry it in a DPoP-Nonce header (WriteAuthError does).
func (s *Server) DPoPNonce() string { return s.dpop.Nonce() }
