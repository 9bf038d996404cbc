// Package pds is Bulwark's HTTP layer: XRPC routing, errors, middleware and
// the handlers, one file per lexicon group. Handlers parse input into
// syntax types, call a domain package (account, repo, blob, ...), and map
// its errors to XRPC errors in one place (domainErrors in errors.go).
// Nothing here is domain logic, and nothing here runs SQL.
//
// Adding an XRPC method is one line in Server.routes plus a handler in its
// own file:
//
//	s.procedure("com.atproto.repo.createRecord", s.handleCreateRecord)
//
//	func (s *Server) handleCreateRecord(w http.ResponseWriter, r *http.Request) error {
//		var in comatproto.RepoCreateRecord_Input
//		if err := decodeJSON(r, &in); err != nil {
//			return err
//		}
//		...
//		return writeJSON(w, http.StatusOK, out)
//	}
//
// Any other path is registered with the rate limit it is charged to
// (Server.handle, routes.go), so that every route is in the route table.
package pds

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/outbound"
	"github.com/bulwark-pds/bulwark/priority"
	"github.com/bulwark-pds/bulwark/proxy"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/replay"
	"github.com/bulwark-pds/bulwark/repo"
)

// HTTP server timeouts. WriteTimeout bounds an ordinary response; methods
// registered longRunning (streams, exports) clear it and manage per-write
// deadlines themselves.
const (
	// ReadHeaderTimeout stops slow-loris clients that trickle headers.
	ReadHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds reading a whole request, body included. A 2 MiB
	// JSON body at a modest uplink fits easily.
	ReadTimeout = 60 * time.Second
	// WriteTimeout bounds writing an ordinary response.
	WriteTimeout = 60 * time.Second
	// IdleTimeout closes keep-alive connections nobody uses.
	IdleTimeout = 120 * time.Second
	// MaxHeaderBytes is generous for tokens (access JWTs, DPoP proofs) and
	// far below net/http's 1 MiB default.
	MaxHeaderBytes = 64 << 10
)

// Options are what New needs.
type Options struct {
	// Config is the finalized server configuration (config.Finalize and
	// EnsureSecrets already called). Required.
	Config *config.Config
	// DB is the Postgres pool. Required.
	DB *pgxpool.Pool
	// Logger is the component logger; nil means slog.Default().
	Logger *slog.Logger
	// Version is reported by /xrpc/_health and the banner.
	Version string
	// Firehose serves com.atproto.sync.subscribeRepos; the caller runs it
	// (Hub.Run). Nil leaves the method unimplemented.
	Firehose *firehose.Hub
	// FirehoseAdmission, when set, replaces the subscribeRepos admission
	// settings derived from Config (tests, benchmarks).
	FirehoseAdmission *firehose.AdmissionConfig
	// Accounts manages accounts and sessions. Nil leaves the account,
	// session, identity and repo methods unimplemented.
	Accounts *account.Service
	// Repo is the repository engine. Nil leaves the repo and sync methods
	// unimplemented.
	Repo *repo.Engine
	// Blobs stores and serves blobs. Nil leaves uploadBlob, getBlob,
	// listBlobs and listMissingBlobs unimplemented.
	Blobs *blob.Service
	// Budget is the in-flight byte budget expensive responses reserve
	// from (getRepo, getBlob, proofs, block lists, large records). Nil
	// means no budget.
	Budget *budget.Budget
	// Limits are the rate limiters (ratelimit.NewSet). Nil means none.
	Limits *ratelimit.Set
	// ExportSlots bounds concurrent getRepo exports, each of which holds
	// a Postgres connection while the client reads. Zero means a quarter
	// of DB's pool; negative means no bound.
	ExportSlots int
	// BackgroundMaxPause bounds how long a background stream (a getRepo
	// export, a blob download) pauses, before each chunk it sends, while
	// writes are in flight ("writes first", package priority). Zero means
	// Config.BackgroundMaxPause (itself zero for never); negative means
	// never pause.
	BackgroundMaxPause time.Duration
	// Priority, when set, is the gate writes enter and streams yield to,
	// used as given (tests; or shared with other background work). Nil
	// means New makes one from BackgroundMaxPause whose pauses are
	// counted in the bulwark_priority_* metrics.
	Priority *priority.Gate
	// OAuth, when set, makes the server an OAuth authorization server
	// (package oauth: its Issuer, Secret and HTTPClient come from here;
	// New fills in Pool, Accounts and, when nil, Logger) and lets every
	// XRPC method accept its DPoP-bound access tokens within their
	// granted scope. Needs Accounts.
	OAuth *oauth.Config
	// Outbound is the client for requests to URLs users influence (handle
	// resolution, the service proxy, OAuth client metadata), built with
	// Config.ProxyAllowPrivate. Nil means one built from Config for handle
	// resolution, and no service proxying: methods this server does not
	// serve answer 501.
	Outbound *outbound.Client
	// Keys signs the service-auth tokens proxied requests carry (the
	// account KeyStore). Nil: proxied requests carry no token.
	Keys proxy.KeySource
	// Console, when set, is served under /admin/ (the operator console,
	// package console), behind the same access log and request ids. It
	// must hold every request to a per-address limit itself; when it is
	// Patterned, Routes lists its pages.
	Console http.Handler
	// Routes are more paths to serve beside the PDS's own (cmd/bulwark's
	// server identity and TLS ask, the development PLC), each under the
	// same middleware and a per-address rate limit.
	Routes []Route
	// OnOverload, when set, is called each time a request is refused with
	// 503 because the in-flight budget (or the getRepo export slots) is
	// full: the overload storm detector counts them.
	OnOverload func()
	// CARCacheDir, when set, is where whole-repository getRepo answers are
	// cached (up to Config.CARCache bytes); the directory is emptied at
	// start. Empty means no cache.
	CARCacheDir string

	// holdRefused, when set (tests), replaces the wait a refused
	// connection is held for (see coolOff): it is called with the
	// request's context and the hold's length, and returns when the hold
	// is over.
	holdRefused func(ctx context.Context, d time.Duration)
	// bodyRate, when set (tests), replaces the minimum rate of
	// long-running requests' bodies (MinBodyRate after BodyGrace).
	bodyRate *bodyRate
}

// Server is the PDS's HTTP front: it owns the routes and the middleware,
// not the listener (cmd/bulwark runs the http.Server from HTTPServer).
type Server struct {
	cfg     *config.Config
	db      *pgxpool.Pool
	logger  *slog.Logger
	version string

	mux     routeMux
	handler http.Handler
	// methods is filled by routes before the first request and only read
	// afterwards, so it needs no lock.
	methods map[string]*method
	// table is the route table Routes lists (routes.go), and prefixes
	// the Options.Routes served by path prefix; both are filled before
	// the first request and only read afterwards.
	table    []PublicRoute
	prefixes []prefixRoute
	// unknownMethod answers /xrpc/ paths with no registered method:
	// serveProxy when the proxy is on, else MethodNotImplemented.
	unknownMethod handlerFunc
	// proxy forwards the methods this server does not serve (nil: off).
	proxy *proxy.Proxy
	// proxyAdmit bounds proxied requests per client and per pool.
	proxyAdmit *proxyAdmission

	shutdownMu    sync.Mutex
	shutdownHooks []func()

	firehose           *firehose.Hub
	subscribeAdmission *firehose.Admission
	subscribeRefusals  refusalLog

	accounts  *account.Service
	repo      *repo.Engine
	directory identityResolver
	// dids fetches did:web documents as they stand now (accounts moving
	// in, activation, handles of did:web accounts); it refreshes the
	// directory's cache as it goes.
	dids account.DocResolver
	// serviceAuth checks service-auth JWTs addressed to this server
	// (createAccount for an existing DID).
	serviceAuth *auth.ServiceAuthValidator
	// replay remembers the service-auth tokens accepted in place of a
	// session (uploadBlob), so that each is used once.
	replay *replay.Store
	// outbound makes every request to a URL a user influences.
	outbound *outbound.Client
	// crawlers asks the configured crawlers to crawl (admin_crawl.go).
	crawlers *outbound.Client

	blobs *blob.Service
	// oauth is the OAuth authorization server (nil: no OAuth).
	oauth *oauth.Server
	// callerDID, when set (tests), replaces session auth for the blob
	// methods: it returns the calling account.
	callerDID callerFunc

	// protect holds the rate limits and budgets (limits.go).
	protect protection
	// priority is what writes enter and background streams yield to.
	priority *priority.Gate
	// carCache holds whole-repository exports on disk (nil: none).
	carCache *carCache
	// exportRate is the byte rate all getRepo answers share (nil: none).
	exportRate *rate.Limiter
	// holdRefused waits out a refused connection's cool-off (coolOff).
	holdRefused func(ctx context.Context, d time.Duration)
	// console serves /admin/ (nil: not here).
	console http.Handler
	// onOverload hears of each 503 ServiceOverloaded (nil: nobody).
	onOverload func()
	// bodyRate is the minimum rate of long-running requests' bodies.
	bodyRate bodyRate
	// health is the database ping _health answers from.
	health healthCheck
}

// New builds a Server and registers its routes.
func New(opts Options) (*Server, error) {
	if opts.Config == nil {
		return nil, errors.New("pds: no config")
	}
	if opts.DB == nil {
		return nil, errors.New("pds: no database pool")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	s := &Server{
		cfg:           opts.Config,
		db:            opts.DB,
		logger:        logger,
		version:       version,
		mux:           routeMux{http.NewServeMux()},
		methods:       map[string]*method{},
		unknownMethod: methodNotImplemented,
		holdRefused:   waitFor,
	}
	if opts.holdRefused != nil {
		s.holdRefused = opts.holdRefused
	}
	s.health.now = time.Now
	s.bodyRate = defaultBodyRate
	if opts.bodyRate != nil {
		s.bodyRate = *opts.bodyRate
	}
	s.outbound = newOutbound(opts, logger)
	s.crawlers = newCrawlersClient(opts.Config, logger)
	dir := newDirectory(opts.Config, s.outbound, logger)
	s.accounts, s.repo, s.directory, s.dids = opts.Accounts, opts.Repo, dir, dir
	s.serviceAuth = newServiceAuthValidator(opts.Config, dir)
	s.replay = replay.New(opts.DB)
	s.blobs = opts.Blobs
	p, err := newProxy(opts, dir, logger)
	if err != nil {
		return nil, err
	}
	if p != nil {
		s.proxy, s.unknownMethod = p, s.serveProxy
	}
	s.console, s.onOverload = opts.Console, opts.OnOverload
	s.protect = newProtection(opts)
	s.proxyAdmit = newProxyAdmission(opts.Config.ProxyMaxPerClient, opts.Config.InflightQueue, s.protect.budget)
	s.priority = newPriorityGate(opts)
	if opts.Config != nil && opts.Config.ExportRate > 0 {
		// A burst of a few chunks: an export starts at once, and the rate
		// holds over any second.
		s.exportRate = rate.NewLimiter(rate.Limit(opts.Config.ExportRate), int(min(opts.Config.ExportRate, 4*streamBuffer)))
	}
	if opts.CARCacheDir != "" && opts.Config != nil && opts.Config.CARCache > 0 && s.protect.exports != nil {
		c, err := newCARCache(opts.CARCacheDir, opts.Config.CARCache)
		if err != nil {
			return nil, err
		}
		s.carCache = c
	}
	if opts.OAuth != nil {
		o, err := s.newOAuth(opts, dir)
		if err != nil {
			return nil, err
		}
		s.oauth = o
	}
	if opts.Firehose != nil {
		s.firehose = opts.Firehose
		s.subscribeAdmission = newSubscribeAdmission(opts)
		s.onShutdown(opts.Firehose.Close)
	}
	s.routes(opts.Routes)
	s.handler = s.observe(s.cors(s.mux.m))
	return s, nil
}

// routes registers every method and path. XRPC methods: one line each,
// grouped by lexicon namespace, handlers in the file of their group.
// Other paths: through handle (routes.go), each with its per-address
// limit.
func (s *Server) routes(extra []Route) {
	// Operations.
	s.query("_health", s.handleHealth)
	s.registerAdminFirehoseRoutes()
	s.registerAdminCrawlRoutes()
	s.registerAdminAccountRoutes()
	s.registerAccountRoutes()
	s.registerEmailRoutes()
	s.registerSessionRoutes()
	s.registerIdentityRoutes()
	s.registerPLCRoutes()
	s.registerPreferenceRoutes()
	s.registerRepoRoutes()
	s.registerImportRoutes()
	s.registerServiceAuthRoutes()
	s.registerSyncRoutes()

	// com.atproto.server
	s.query("com.atproto.server.describeServer", s.handleDescribeServer)

	// com.atproto.sync
	if s.firehose != nil {
		s.query("com.atproto.sync.subscribeRepos", s.handleSubscribeRepos, longRunning())
	}

	// Paths outside /xrpc.
	s.handle("GET /{$}", ratelimit.PolicyGlobal, http.HandlerFunc(s.handleRoot))
	s.handle("GET /robots.txt", ratelimit.PolicyGlobal, http.HandlerFunc(s.handleRobots))
	s.mountOAuth()
	// serveXRPC charges each request to the global limit (globalLimit)
	// or, for subscribeRepos, to the firehose admission.
	s.handleSelfLimited("/xrpc/", s.withDPoPNonce(s.serveXRPC), "", nil)
	if s.console != nil {
		var pages []string
		if p, ok := s.console.(Patterned); ok {
			pages = p.Patterns()
		}
		s.handleSelfLimited("/admin/", s.console, "/admin/", pages)
	}
	s.mountRoutes(extra)
	s.handleSelfLimited("/", s.fallback(), "", nil)
}

// Outbound is the client every request to a URL a user influences goes
// through (Options.Outbound, or the one New built).
func (s *Server) Outbound() *outbound.Client { return s.outbound }

// Priority is the gate writes enter and background streams yield to
// (package priority).
func (s *Server) Priority() *priority.Gate { return s.priority }

// Handler is the whole HTTP surface with its middleware, for an
// http.Server or httptest.
func (s *Server) Handler() http.Handler { return s.handler }

// HTTPServer returns an http.Server for the configured listen address with
// the timeouts above. The caller runs it (Serve) and stops it (Shutdown).
func (s *Server) HTTPServer() *http.Server {
	hs := &http.Server{
		Addr:              s.cfg.Listen,
		Handler:           s.handler,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	hs.RegisterOnShutdown(s.runShutdownHooks)
	return hs
}

// onShutdown registers f to run when the http.Server begins shutting down.
// http.Server.Shutdown does not wait for hijacked connections (WebSockets),
// so code that holds them registers here to close them.
func (s *Server) onShutdown(f func()) {
	s.shutdownMu.Lock()
	defer s.shutdownMu.Unlock()
	s.shutdownHooks = append(s.shutdownHooks, f)
}

func (s *Server) runShutdownHooks() {
	s.shutdownMu.Lock()
	hooks := s.shutdownHooks
	s.shutdownHooks = nil
	s.shutdownMu.Unlock()
	for _, f := range hooks {
		f()
	}
}

type ctxKey int

const requestIDKey ctxKey = iota

// RequestID returns the request id observe gave the request, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// requestIDFrom accepts a client's X-Request-Id when it is short and plain
// (it is echoed and logged), else makes a new one.
func requestIDFrom(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 && isPlainToken(id) {
		return id
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func isPlainToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == ':' || c == '/' || c == '+' || c == '='
		if !ok {
			return false
		}
	}
	return true
}

// observe is the outer middleware: request id, panic recovery and the
// access log, in one place because all three share the response recorder.
// The access log never records headers (Authorization, cookies) or the
// query string.
func (s *Server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := requestIDFrom(r)
		w.Header().Set("X-Request-Id", id)
		ctx := context.WithValue(r.Context(), requestIDKey, id)
		r = r.WithContext(ctx)
		rec := &responseRecorder{ResponseWriter: w}

		defer func() {
			elapsed := time.Since(start)
			status := rec.status
			if status == 0 {
				// The handler wrote nothing: net/http sends 200.
				status = http.StatusOK
			}
			refused := status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
			level := slog.LevelInfo
			if r.URL.Path == "/xrpc/_health" || refused {
				// A flood of refusals would otherwise write a log line
				// each, exactly when the server is busiest; the metrics
				// count them (and handleSubscribeRepos logs a summary).
				level = slog.LevelDebug
			}
			if s.logger.Enabled(ctx, level) {
				s.logger.LogAttrs(ctx, level, "request",
					slog.String("request_id", id),
					slog.String("method", r.Method),
					slog.String("path", clip(r.URL.Path, maxLoggedPath)),
					slog.Int("status", status),
					slog.Int64("bytes", rec.bytes),
					slog.Duration("duration", elapsed),
					slog.String("client", s.clientIP(r).String()),
					slog.String("user_agent", userAgent(r)),
				)
			}
			s.observeRequest(r, status, rec.hijacked, elapsed)
			if refused && !rec.hijacked {
				s.coolOff(rec, r)
			}
		}()
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				// net/http's way to abort a response silently.
				panic(v)
			}
			s.logger.Error("panic in handler", "request_id", id, "path", clip(r.URL.Path, maxLoggedPath),
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if rec.wroteHeader || rec.hijacked {
				// Too late for an error body; make sure the client does not
				// take a truncated response for a complete one.
				panic(http.ErrAbortHandler)
			}
			s.writeError(rec, r, InternalServerError())
		}()
		next.ServeHTTP(rec, r)
	})
}

// responseRecorder notes the status and size of a response for the log and
// for deciding whether an error can still be written. It passes Flush and
// Hijack through (Hijack for gorilla/websocket, which asserts the
// interface) and Unwrap for http.ResponseController.
type responseRecorder struct {
	http.ResponseWriter
	status      int
	bytes       int64
	wroteHeader bool
	hijacked    bool
}

func (rw *responseRecorder) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses (103 Early Hints) come before the real one.
		rw.ResponseWriter.WriteHeader(code)
		return
	}
	if !rw.wroteHeader {
		rw.status = code
		rw.wroteHeader = true
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *responseRecorder) Write(b []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	n, err := rw.ResponseWriter.Write(b)
	rw.bytes += int64(n)
	return n, err
}

// Flush sends buffered data to the client.
func (rw *responseRecorder) Flush() {
	_ = http.NewResponseController(rw.ResponseWriter).Flush()
}

// Hijack hands the connection to the caller (WebSocket upgrade).
func (rw *responseRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rw.ResponseWriter).Hijack()
	if err == nil {
		rw.hijacked = true
		rw.status = http.StatusSwitchingProtocols
	}
	return conn, brw, err
}

// Unwrap exposes the underlying writer to http.ResponseController.
func (rw *responseRecorder) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

// CORS: the Bluesky web app and other browser clients call the PDS from
// another origin. Every response may be read by any origin (no cookies are
// used, so "*" is safe); preflight requests are answered here, before
// routing, and allow whatever headers the browser asks for, as the
// reference PDS does: clients add atproto headers over time
// (atproto-proxy, atproto-accept-labelers, DPoP) and a fixed list would
// break them one by one.
const (
	corsAllowMethods   = "GET, HEAD, POST, OPTIONS"
	corsDefaultHeaders = "Authorization, Content-Type, atproto-proxy, atproto-accept-labelers, DPoP"
	corsExposeHeaders  = "RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, RateLimit-Policy, Retry-After, " +
		"atproto-repo-rev, atproto-content-labelers, DPoP-Nonce, WWW-Authenticate, Content-Language, X-Request-Id"
	corsMaxAge = "86400"
)

// cors sets the CORS headers and answers preflights, each charged to the
// client's address under the preflight limit (apart from the global one:
// a browser sends one before many of its requests).
func (s *Server) cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		if r.Method != http.MethodOptions {
			next.ServeHTTP(w, r)
			return
		}
		if err := s.rateLimit(w, ratelimit.PolicyPreflight, s.ipKey(r), 1); err != nil {
			s.writeError(w, r, err)
			return
		}
		h.Set("Access-Control-Allow-Methods", corsAllowMethods)
		if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
			h.Set("Access-Control-Allow-Headers", req)
			h.Add("Vary", "Access-Control-Request-Headers")
		} else {
			h.Set("Access-Control-Allow-Headers", corsDefaultHeaders)
		}
		h.Set("Access-Control-Max-Age", corsMaxAge)
		h.Set("Allow", corsAllowMethods)
		w.WriteHeader(http.StatusNoContent)
	})
}

// coolOff holds a connection whose request was just refused (429 or 503)
// for the Retry-After the answer gave, at most cfg.RefusalCoolOff, before
// net/http reads its next request. The refusal itself is sent at once
// (flushed here); what waits is the client's next request on the same
// connection, which it was told to hold back anyway. A client that ignores
// Retry-After and re-asks at once on a kept-alive connection (a scraper
// fleet re-requesting on every 503) so costs no CPU until then, instead of
// taking the cores a user's write needs. Connections from trusted proxies
// are never held: one carries many clients' requests.
func (s *Server) coolOff(rec *responseRecorder, r *http.Request) {
	max := s.cfg.RefusalCoolOff
	if max <= 0 {
		return
	}
	if peer, ok := peerAddr(r); !ok || s.trusted(peer) {
		return
	}
	wait := max
	if secs, err := strconv.Atoi(rec.Header().Get("Retry-After")); err == nil && secs >= 0 {
		wait = min(wait, time.Duration(secs)*time.Second)
	}
	if wait <= 0 {
		return
	}
	// Counted before the refusal is flushed, so that whoever reads the
	// metric after seeing the 429 sees this hold counted.
	metrics.RefusalCoolOffs.Inc()
	rec.Flush()
	s.holdRefused(r.Context(), wait)
}

// waitFor returns after d, or sooner when ctx ends (the client went away).
func waitFor(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// clientIP is the address a request came from: the TCP peer, or, when the
// peer is a trusted proxy, the nearest address in X-Forwarded-For that is
// not one. Walking from the right matters: everything left of the last
// trusted hop was written by the client and may be forged.
func (s *Server) clientIP(r *http.Request) netip.Addr {
	addr, ok := peerAddr(r)
	if !ok {
		return netip.Addr{}
	}
	if !s.trusted(addr) {
		return addr
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		hop = hop.Unmap()
		if !s.trusted(hop) {
			return hop
		}
		addr = hop
	}
	return addr
}

// ClientIP is the address r came from, as the rate limits see it: the
// TCP peer, or the nearest untrusted address a trusted proxy forwarded.
func (s *Server) ClientIP(r *http.Request) netip.Addr { return s.clientIP(r) }

// peerAddr is the TCP peer of r.
func peerAddr(r *http.Request) (netip.Addr, bool) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	return peer.Addr().Unmap(), true
}

func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
