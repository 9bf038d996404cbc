package pds

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
)

// healthTimeout bounds the database ping of /xrpc/_health, so that a load
// balancer's probe fails promptly instead of hanging with the database.
const healthTimeout = 2 * time.Second

type healthOutput struct {
	Version  string `json:"version"`
	Database string `json:"database"`
}

// healthCacheTTL is how long one database ping answers every health check:
// _health has no per-address limit (unlimitedMethods), so a flood of it
// must cost no database work.
const healthCacheTTL = time.Second

// healthCheck is the last database ping of _health, shared by the checks
// that come within healthCacheTTL of it.
type healthCheck struct {
	mu  sync.Mutex
	at  time.Time
	err error
	// pings counts the pings made (tests).
	pings int
	// now is the clock (tests replace it).
	now func() time.Time
}

// handleHealth answers GET /xrpc/_health: the version, and whether Postgres
// answers. 503 when it does not, so that a load balancer takes this node
// out of rotation.
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) error {
	if err := s.databaseUp(r.Context()); err != nil {
		return writeJSON(w, http.StatusServiceUnavailable, healthOutput{Version: s.version, Database: "unreachable"})
	}
	return writeJSON(w, http.StatusOK, healthOutput{Version: s.version, Database: "ok"})
}

// databaseUp pings the database, or returns the result of a ping made less
// than healthCacheTTL ago. Checks that arrive during a ping wait for it.
func (s *Server) databaseUp(ctx context.Context) error {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if h.pings > 0 && now.Sub(h.at) < healthCacheTTL {
		return h.err
	}
	// Not the caller's context: a client that goes away must not make
	// the next second's checks fail.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthTimeout)
	defer cancel()
	h.err, h.at = s.db.Ping(ctx), now
	h.pings++
	if h.err != nil {
		s.logger.Warn("health check: database unreachable", "request_id", RequestID(ctx), "error", h.err)
	}
	return h.err
}

// handleDescribeServer answers com.atproto.server.describeServer from the
// configuration alone: clients call it before anything else, so it must
// never depend on the database.
func (s *Server) handleDescribeServer(w http.ResponseWriter, r *http.Request) error {
	no := false
	invite := s.cfg.InviteRequired
	out := comatproto.ServerDescribeServer_Output{
		Did:                       s.cfg.ServiceDID(),
		AvailableUserDomains:      s.cfg.HandleDomains,
		InviteCodeRequired:        &invite,
		PhoneVerificationRequired: &no,
	}
	if out.AvailableUserDomains == nil {
		out.AvailableUserDomains = []string{}
	}
	if s.cfg.PrivacyPolicyURL != "" || s.cfg.TermsOfServiceURL != "" {
		out.Links = &comatproto.ServerDescribeServer_Links{
			PrivacyPolicy:  optional(s.cfg.PrivacyPolicyURL),
			TermsOfService: optional(s.cfg.TermsOfServiceURL),
		}
	}
	if s.cfg.ContactEmail != "" {
		out.Contact = &comatproto.ServerDescribeServer_Contact{Email: optional(s.cfg.ContactEmail)}
	}
	return writeJSON(w, http.StatusOK, s.describeServer(&out))
}

// optional is nil for "", else a pointer to s: lexicon types mark optional
// strings with pointers.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// handleRoot is the banner at /, for a human who opens the server's URL.
func (s *Server) handleRoot(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, `Bulwark %s: an atproto Personal Data Server.

This is an API server for atproto clients (https://atproto.com), not a
website. Most of its API is at /xrpc/.
`, s.version)
}

// handleRobots keeps crawlers off: nothing here is meant to be indexed.
func (s *Server) handleRobots(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, "User-agent: *\nDisallow: /\n")
}

// handleNotFound answers paths that are neither XRPC nor known pages, in the
// XRPC error shape so that clients parse it like any other error.
func (s *Server) handleNotFound(w http.ResponseWriter, r *http.Request) {
	s.writeError(w, r, NotFound("no such path: %s", r.URL.Path))
}
