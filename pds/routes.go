package pds

import (
	"net/http"
	"slices"
	"strings"

	"github.com/bulwark-pds/bulwark/ratelimit"
)

// The public listener's route table. Every path the server answers is
// registered through handle or handleSelfLimited, each with how its
// requests are held to a per-address limit, and nothing reaches a handler
// before that limit: the CORS preflights are charged in cors, the XRPC
// methods in serveXRPC (globalLimit), the OAuth endpoints and the console
// by their own per-address limiters, everything else here. Routes lists
// the table for cmd/bulwark's route-table test, which sends a burst to
// every route and expects a 429.

// Route is a path served beside the PDS's own (cmd/bulwark's server
// identity and TLS ask, the development PLC): it runs under the server's
// middleware (request id, access log, metrics, CORS) and a per-address
// rate limit, like every other route.
type Route struct {
	// Pattern is an http.ServeMux pattern ("GET /tls-ask").
	Pattern string
	// Prefix, instead of Pattern, routes every path that starts with it
	// and that no pattern matches, for paths no pattern can name (the
	// development PLC's /did:plc:...).
	Prefix string
	// Policy is the rate limit (ratelimit.Policy*) charged to the client's
	// address before Handler runs; "" is the global limit.
	Policy string
	// Handler serves the route. When it is Patterned, Routes lists its
	// patterns too.
	Handler http.Handler
}

// PublicRoute is one entry of Routes.
type PublicRoute struct {
	// Pattern is an http.ServeMux pattern ("GET /robots.txt",
	// "/oauth/"), "GET /xrpc/NSID" or "POST /xrpc/NSID" for an XRPC
	// method, or a path prefix followed by "*".
	Pattern string
	// Mount, for a pattern of a handler mounted under a path prefix (the
	// console's under /admin/, the development PLC's under /did:plc:),
	// is that prefix: only paths under it reach the pattern.
	Mount string
	// Unlimited says why the route has no per-address limit; empty for
	// every route that has one.
	Unlimited string
}

// Patterned is a handler that lists the http.ServeMux patterns it serves
// (the console, the development PLC), so that Routes lists them too.
type Patterned interface {
	Patterns() []string
}

// unlimitedMethods are the XRPC methods under no per-address limit, and
// why. globalLimit reads it, and Routes reports it.
var unlimitedMethods = map[string]string{
	"_health": "load balancers must get an answer whatever other clients on their address do; " +
		"every answer within healthCacheTTL shares one database ping, so a flood costs no database work",
}

// routeMux is the server's mux. Only handle and handleSelfLimited
// register on it, so that every route is in the table with its limit.
type routeMux struct{ m *http.ServeMux }

// prefixRoute is a Route with a Prefix, served by fallback.
type prefixRoute struct {
	prefix string
	h      http.Handler
}

// handle registers h at pattern behind the per-address limit policy ("":
// global).
func (s *Server) handle(pattern, policy string, h http.Handler) {
	s.table = append(s.table, PublicRoute{Pattern: pattern})
	s.mux.m.Handle(pattern, s.limitAddress(policy, h))
}

// handleSelfLimited registers h at pattern, a handler that holds every
// request to a per-address limit itself before any work (the XRPC router,
// the OAuth endpoints, the console). sub are its own patterns, listed by
// Routes under mount ("" when they are full paths).
func (s *Server) handleSelfLimited(pattern string, h http.Handler, mount string, sub []string) {
	s.table = append(s.table, PublicRoute{Pattern: pattern})
	for _, p := range sub {
		s.table = append(s.table, PublicRoute{Pattern: p, Mount: mount})
	}
	s.mux.m.Handle(pattern, h)
}

// mountRoutes registers the Options.Routes.
func (s *Server) mountRoutes(routes []Route) {
	for _, rt := range routes {
		var sub []string
		if p, ok := rt.Handler.(Patterned); ok {
			sub = p.Patterns()
		}
		if rt.Prefix != "" {
			s.table = append(s.table, PublicRoute{Pattern: rt.Prefix + "*"})
			s.prefixes = append(s.prefixes, prefixRoute{prefix: rt.Prefix, h: s.limitAddress(rt.Policy, rt.Handler)})
			for _, p := range sub {
				s.table = append(s.table, PublicRoute{Pattern: p, Mount: rt.Prefix})
			}
			continue
		}
		s.handle(rt.Pattern, rt.Policy, rt.Handler)
		_, path, found := strings.Cut(rt.Pattern, " ")
		if !found {
			path = rt.Pattern
		}
		for _, p := range sub {
			s.table = append(s.table, PublicRoute{Pattern: p, Mount: path})
		}
	}
}

// fallback answers the paths no pattern matches: a Route's prefix, or
// 404, each under its limit.
func (s *Server) fallback() http.Handler {
	notFound := s.limitAddress(ratelimit.PolicyGlobal, http.HandlerFunc(s.handleNotFound))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range s.prefixes {
			if strings.HasPrefix(r.URL.Path, p.prefix) {
				p.h.ServeHTTP(w, r)
				return
			}
		}
		notFound.ServeHTTP(w, r)
	})
}

// limitAddress charges the client's address one request of policy ("":
// global) before h runs, and answers 429 in the XRPC error shape past it.
func (s *Server) limitAddress(policy string, h http.Handler) http.Handler {
	if policy == "" {
		policy = ratelimit.PolicyGlobal
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.rateLimit(w, policy, s.ipKey(r), 1); err != nil {
			s.writeError(w, r, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Routes lists every route of the public listener: the mux's patterns,
// each XRPC method, the OAuth endpoints, and the patterns of mounted
// handlers that list theirs (Patterned), with the reason of any route
// that has no per-address limit.
func (s *Server) Routes() []PublicRoute {
	out := slices.Clone(s.table)
	for _, nsid := range sortedNSIDs(s.methods) {
		verb := http.MethodGet
		if s.methods[nsid].kind == kindProcedure {
			verb = http.MethodPost
		}
		out = append(out, PublicRoute{Pattern: verb + " /xrpc/" + nsid, Unlimited: unlimitedMethods[nsid]})
	}
	return out
}

func sortedNSIDs(m map[string]*method) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// recordingMux is an oauth.Mux that notes the patterns registered on it.
type recordingMux struct {
	*http.ServeMux
	patterns []string
}

func (m *recordingMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.HandleFunc(pattern, h)
}
