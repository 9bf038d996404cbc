package main

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/serverid"
)

// TestEveryPublicRouteIsLimited is the route table of the public listener
// as serve builds it, read from the registration itself (pds.Server.Routes:
// the mux's patterns, every XRPC method, the OAuth endpoints, the
// console's pages, the development PLC's API, the server identity and TLS
// ask), and a burst at each, from an address of its own, on a server whose
// every limit is tiny: each is refused with 429 within its policy's limit,
// and that policy is the table's. A route with no per-address limit
// fails, unless the server says why it needs none (PublicRoute.Unlimited).
// Each route's CORS preflight is limited too. Run with -v for the table.
func TestEveryPublicRouteIsLimited(t *testing.T) {
	t.Parallel()
	tl := newTinyLimits(4)
	ps := startPublicServer(t, "--ratelimits", tl.flag, "--refusal-cooloff", "0",
		"--appview-url", fakeAppView(t), "--proxy-allow-private", "127.0.0.1/32")
	routes := concretize(ps.srv.Routes())
	// The table comes from the registration: whatever is registered is in
	// it (a few that must be, as a check of the reading).
	var names []string
	for _, c := range routes {
		names = append(names, c.String())
	}
	for _, want := range []string{
		"GET " + serverid.AskPath, "GET " + serverid.IdentifyPath, "GET /" + plausibleDID + "/log/audit", "POST /" + plausibleDID,
		"GET /xrpc/_health", "POST /xrpc/com.atproto.server.createAccount", "GET /xrpc/com.atproto.sync.subscribeRepos",
		"POST " + oauth.PathPAR, "GET /admin/login", "POST /admin/login", "GET /", "GET /robots.txt",
		"GET /.well-known/atproto-did", "GET " + oauth.PathASMetadata, "GET /xrpc/" + unknownSegment,
	} {
		require.Contains(t, names, want)
	}

	const max = 8
	var mu sync.Mutex
	var table []string
	inParallel(routes, 6, func(c concreteRoute) {
		res := burst(ps, tl, c, max, func(int) *http.Request { return requestTo(ps, c, "{}") })
		pre := burst(ps, tl, concreteRoute{route: c.route, method: http.MethodOptions, path: c.path}, max, func(int) *http.Request {
			req := requestTo(ps, concreteRoute{method: http.MethodOptions, path: c.path}, "")
			req.Header.Set("Origin", "https://app.example")
			req.Header.Set("Access-Control-Request-Method", c.method)
			return req
		})
		line, problems := judgeRoute(tl, c, res, pre)
		mu.Lock()
		defer mu.Unlock()
		table = append(table, line)
		for _, p := range problems {
			t.Error(p)
		}
	})
	sort.Strings(table)
	t.Logf("%d routes:\n%s", len(routes), strings.Join(table, "\n"))

	// The routes serve adds to the PDS's own run under its access log.
	for _, path := range []string{serverid.AskPath, serverid.IdentifyPath, "/" + plausibleDID + "/log"} {
		require.Contains(t, ps.logs.String(), "path="+path+" ", "no access log line for %s", path)
	}
}

// judgeRoute checks a route's burst and its preflight's, and returns the
// route's line of the table.
func judgeRoute(tl *tinyLimits, c concreteRoute, res, pre burstResult) (string, []string) {
	var problems []string
	for _, r := range []burstResult{res, pre} {
		if r.problem != "" {
			problems = append(problems, r.problem)
		}
	}
	if !pre.limited || pre.refused != ratelimit.PolicyPreflight || pre.allowed != tl.limit[ratelimit.PolicyPreflight] {
		problems = append(problems, fmt.Sprintf("OPTIONS %s: preflights not held to the preflight limit: %d allowed, then %q (%v)",
			c.path, pre.allowed, pre.refused, pre.statuses))
	}
	line := fmt.Sprintf("%-7s %-70s ", c.method, c.path)
	switch {
	case c.route.Unlimited != "":
		if res.limited {
			problems = append(problems, fmt.Sprintf("%s: said to be unlimited (%s), but refused by %q", c, c.route.Unlimited, res.refused))
		}
		return line + "none: " + c.route.Unlimited, problems
	case !res.limited:
		problems = append(problems, fmt.Sprintf("%s: no per-address limit: %d requests from one address, none refused (%v)", c, res.allowed, res.statuses))
		return line + "NONE", problems
	case res.refused == "":
		// A limit of its own, without the RateLimit-* headers: only the
		// firehose admission (a bucket per address) answers so.
		if !strings.HasSuffix(c.path, "com.atproto.sync.subscribeRepos") {
			problems = append(problems, fmt.Sprintf("%s: 429 without a RateLimit-Policy header naming its policy", c))
		}
		return line + fmt.Sprintf("firehose admission (%d allowed)", res.allowed), problems
	case res.allowed != tl.limit[res.refused]:
		// Each request must cost one point of each policy it is under:
		// fewer allowed means one was charged twice.
		problems = append(problems, fmt.Sprintf("%s: %d allowed before %s refused, whose limit is %d", c, res.allowed, res.refused, tl.limit[res.refused]))
	}
	return line + res.refused, problems
}
