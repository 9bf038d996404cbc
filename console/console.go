package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/internal/keyring"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// Prefix is the path the console is served under.
const Prefix = "/admin/"

// AuditActor is the actor of the console's audit entries.
const AuditActor = "console"

// DefaultSessionTTL is how long a console login lasts.
const DefaultSessionTTL = 30 * time.Minute

// CSP is the Content-Security-Policy of every console response: nothing
// but the console's own stylesheet, inline SVG and data: images, and
// forms posting back to the console.
const CSP = "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'"

// maxFormBytes bounds a console form body.
const maxFormBytes = 16 << 10

// ErrConfig means a required Config field is missing.
var ErrConfig = errors.New("console: incomplete configuration")

// Config is what the console needs. AdminPassword, SessionSecret, Log and
// DB are required; the rest is shown when present.
type Config struct {
	// AdminPassword is the password the login form accepts (the server's
	// admin password).
	AdminPassword string
	// AdminPasswordFile is the file on the server the admin password was
	// read from, which the login page names; empty means it was set with
	// BULWARK_ADMIN_PASSWORD (--admin-password), which the page names
	// instead. The password itself is never shown.
	AdminPasswordFile string
	// SessionSecret is the key material sessions and CSRF tokens are
	// derived from (the JWT secret, at least 32 bytes).
	SessionSecret []byte
	// Secure marks cookies Secure; false only for a plain-http server.
	Secure bool
	// SessionTTL is how long a login lasts (default DefaultSessionTTL).
	SessionTTL time.Duration
	// Log reads and repairs the event log.
	Log *eventlog.Log
	// Sync builds a repository's fresh #sync for the emit-sync repair
	// (repo.SyncEvent); nil hides that repair.
	Sync eventlog.SyncSource
	// DB is read for the audit log (audit.List).
	DB db.DBTX
	// Accounts manages accounts; nil hides the account pages.
	Accounts *account.Service
	// Watch is the relay watch; nil shows no relays.
	Watch *relaywatch.Watch
	// Health tracks firehose consumers; nil shows none.
	Health *firehose.Health
	// Samples holds the overview's per-minute history; nil shows none.
	Samples *Sampler
	// Budget is the in-flight byte budget; nil shows none.
	Budget *budget.Budget
	// LoginLimiter limits login attempts per client address (the
	// consoleLogin policy); nil allows every attempt.
	LoginLimiter *ratelimit.Limiter
	// Limiter limits every console request per client address (the
	// global policy, shared with XRPC), logged in or not; nil allows
	// every request.
	Limiter *ratelimit.Limiter
	// ClientIP is the request's client address (default: the TCP peer);
	// the pds passes its own, which believes only trusted proxies.
	ClientIP func(*http.Request) netip.Addr
	// Logger receives the console's writes (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Console serves the operator console. Mount it at Prefix.
type Console struct {
	cfg   Config
	log   *slog.Logger
	keys  *keyring.Ring
	mux   *http.ServeMux
	pages *pages
	// patterns are the mux's patterns (Patterns).
	patterns []string
}

// New returns a console for cfg.
func New(cfg Config) (*Console, error) {
	switch {
	case cfg.AdminPassword == "":
		return nil, fmt.Errorf("%w: no admin password", ErrConfig)
	case len(cfg.SessionSecret) < 32:
		return nil, fmt.Errorf("%w: session secret shorter than 32 bytes", ErrConfig)
	case cfg.Log == nil || cfg.DB == nil:
		return nil, fmt.Errorf("%w: no event log or database", ErrConfig)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.ClientIP == nil {
		cfg.ClientIP = peerIP
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p, err := loadPages()
	if err != nil {
		return nil, err
	}
	ring, err := keyring.New(cfg.SessionSecret)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	c := &Console{
		cfg: cfg, log: cfg.Logger.With("component", "console"),
		// Bound to the admin password: a new password ends every session.
		keys: ring.With(cfg.AdminPassword), mux: http.NewServeMux(), pages: p,
	}
	c.routes()
	return c, nil
}

// routes registers the console's pages. Every page but the login form and
// the stylesheet needs a session; every POST needs its CSRF token.
func (c *Console) routes() {
	m := &patternMux{ServeMux: c.mux, patterns: &c.patterns}
	m.HandleFunc("GET "+Prefix+"static/{file}", c.handleStatic)
	m.HandleFunc("GET "+Prefix+"login", c.handleLoginForm)
	m.HandleFunc("POST "+Prefix+"login", c.handleLogin)
	m.Handle("POST "+Prefix+"logout", c.post(c.handleLogout))
	m.Handle("GET "+Prefix+"{$}", c.page(c.handleOverview))
	m.Handle("POST "+Prefix+"relays/check", c.post(c.handleCheckRelays))
	m.Handle("GET "+Prefix+"firehose", c.page(c.handleEvents))
	m.Handle("GET "+Prefix+"firehose/event/{seq}", c.page(c.handleEvent))
	m.Handle("GET "+Prefix+"firehose/event/{seq}/confirm", c.page(c.handleConfirm))
	m.Handle("POST "+Prefix+"firehose/event/{seq}/repair", c.post(c.handleRepair))
	m.Handle("GET "+Prefix+"accounts", c.page(c.handleAccounts))
	m.Handle("GET "+Prefix+"accounts/{did}", c.page(c.handleAccount))
	m.Handle("POST "+Prefix+"accounts/{did}/status", c.post(c.handleAccountStatus))
	m.Handle("POST "+Prefix+"accounts/{did}/password", c.post(c.handleResetPassword))
	m.Handle("GET "+Prefix+"invites", c.page(c.handleInvites))
	m.Handle("POST "+Prefix+"invites", c.post(c.handleCreateInvites))
	m.Handle("GET "+Prefix+"audit", c.page(c.handleAudit))
	m.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "There is no such console page.")
	})
}

// Patterns lists the console's routes (the http.ServeMux patterns), for
// the server's route table. Every one is under the per-address limit
// ServeHTTP applies first.
func (c *Console) Patterns() []string { return slices.Clone(c.patterns) }

// patternMux notes the patterns registered on it.
type patternMux struct {
	*http.ServeMux
	patterns *[]string
}

func (m *patternMux) Handle(pattern string, h http.Handler) {
	*m.patterns = append(*m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *patternMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// ServeHTTP serves the console with its security headers.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer browsers send
	// "Origin: null" with the console's own forms, which sameOrigin refuses.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	// The pds's CORS layer lets any origin read its XRPC answers; the
	// console's are for itself alone.
	h.Del("Access-Control-Allow-Origin")
	h.Del("Access-Control-Expose-Headers")
	if l := c.cfg.Limiter; l != nil {
		now := c.cfg.Now()
		if d := l.AllowN(ratelimit.IPKey(c.cfg.ClientIP(r)), 1); !d.Allowed {
			ratelimit.SetHeaders(h, d, now)
			h.Set(ratelimit.HeaderRetryAfter, strconv.FormatInt(ratelimit.RetryAfterSeconds(d.RetryAfter), 10))
			c.fail(w, r, http.StatusTooManyRequests, "Too many requests from your address; try again in "+d.RetryAfter.Round(time.Second).String()+".")
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

// handler is a console page or action for a logged-in operator.
type handler func(w http.ResponseWriter, r *http.Request, s session) error

// page wraps a GET page: without a session, the login form.
func (c *Console) page(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := c.sessionOf(r)
		if err != nil && !errors.Is(err, errBadCookie) {
			c.log.Error("console session check failed", "err", err)
			c.fail(w, r, http.StatusInternalServerError, "Something went wrong; the server log has the details.")
			return
		}
		if err != nil {
			next := r.URL.Path
			if r.URL.RawQuery != "" && len(r.URL.RawQuery) < 1024 {
				next += "?" + r.URL.RawQuery
			}
			http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(next), http.StatusSeeOther)
			return
		}
		c.run(w, r, s, h)
	})
}

// post wraps a form action: it needs a session, a same-origin request and
// the session's CSRF token.
func (c *Console) post(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := c.sessionOf(r)
		if err != nil && !errors.Is(err, errBadCookie) {
			c.log.Error("console session check failed", "err", err)
			c.fail(w, r, http.StatusInternalServerError, "Something went wrong; the server log has the details.")
			return
		}
		if err != nil {
			c.fail(w, r, http.StatusForbidden, "Your console session is over. Log in again.")
			return
		}
		if !sameOrigin(r) {
			c.fail(w, r, http.StatusForbidden, "The form was not sent from this console.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, http.StatusBadRequest, "The form could not be read.")
			return
		}
		if !c.checkCSRF(keyring.ConsoleSessionCSRF, s, r.PostForm.Get(csrfField)) {
			c.fail(w, r, http.StatusForbidden, "The form has no valid CSRF token: reload the page and try again.")
			return
		}
		c.run(w, r, s, h)
	})
}

// run calls h and answers its error, if any.
func (c *Console) run(w http.ResponseWriter, r *http.Request, s session, h handler) {
	err := h(w, r, s)
	if err == nil {
		return
	}
	var ue *userError
	if errors.As(err, &ue) {
		c.fail(w, r, ue.status, ue.msg)
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return
	}
	c.log.Error("console page failed", "path", r.URL.Path, "err", err)
	c.fail(w, r, http.StatusInternalServerError, "Something went wrong; the server log has the details.")
}

// userError is a refusal the operator should read: bad input, a missing
// subject, a repair that does not apply.
type userError struct {
	status int
	msg    string
}

func (e *userError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &userError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &userError{status: http.StatusNotFound, msg: fmt.Sprintf(format, args...)}
}

func conflict(format string, args ...any) error {
	return &userError{status: http.StatusConflict, msg: fmt.Sprintf(format, args...)}
}

// sameOrigin refuses requests a browser marks as cross-site, or whose
// Origin names another host.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	origin := r.Header.Get("Origin")
	if origin == "" || origin == "null" {
		return origin == ""
	}
	// An origin is scheme://host[:port] and nothing else.
	u, err := url.Parse(origin)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.User == nil && u.Path == "" && u.RawQuery == "" &&
		strings.EqualFold(u.Host, r.Host)
}

// peerIP is the TCP peer of r.
func peerIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// csrf is the CSRF token for forms rendered in s.
func (c *Console) csrf(s session) string { return c.csrfToken(keyring.ConsoleSessionCSRF, s) }
