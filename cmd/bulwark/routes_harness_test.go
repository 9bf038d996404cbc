package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/serverid"
)

// The harness of the route-table and state-growth tests: the public
// listener serve builds, built here by the same functions on a test
// database (so that its route table can be read), with every rate limit
// tiny; and clients that each come from an address of their own.

// publicServer is serve's public listener, in this process.
type publicServer struct {
	url  string
	srv  *pds.Server
	pool *pgxpool.Pool
	cfg  *config.Config
	logs *syncbuf.Buffer
}

// startPublicServer builds and serves what serve does for args (serve's
// flags; the development PLC is on for the local host name), on a fresh
// test database, with its background services running.
func startPublicServer(t *testing.T, args ...string) *publicServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fs, cfg := settingsFlags("serve", io.Discard)
	all := append([]string{"--listen", ln.Addr().String(), "--data-dir", t.TempDir(), "--log-format", "text"}, args...)
	_, ok := parseSettings(fs, cfg, all)
	require.True(t, ok, "flags %v", all)
	require.NoError(t, cfg.Bound(ln.Addr().String()))
	_, err = cfg.EnsureSecrets()
	require.NoError(t, err)
	pool := dbtest.New(t)
	logs := &syncbuf.Buffer{}
	logger := cfg.NewLogger(logs)
	// As serve does (serve.go).
	devPLC := newDevPLC(cfg, pool, logger)
	rt := serverid.NewRuntime(adminURL(cfg.Listen), cfg.PublicURL(), cfg.ServiceDID())
	b, err := buildServer(context.Background(), cfg, pool, nil, devPLC, nil, logger, publicRoutes(cfg, pool, &rt, devPLC))
	require.NoError(t, err)
	svcs := startServices(b.services)
	hs := b.srv.HTTPServer()
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		_ = hs.Close()
		svcs.stop()
	})
	return &publicServer{url: "http://" + ln.Addr().String(), srv: b.srv, pool: pool, cfg: cfg, logs: logs}
}

// tinyLimits are rate limits small enough to meet in a few requests: every
// policy allows 2 requests (the global and getRepo limits a few more),
// each in a window of its own length, so that a refusal's
// RateLimit-Policy header ("2;w=SECONDS") names the policy that refused.
type tinyLimits struct {
	limit  map[string]int
	byWind map[string]string // window in seconds -> policy
	flag   string            // --ratelimits
}

func newTinyLimits(global int) *tinyLimits {
	tl := &tinyLimits{limit: map[string]int{}, byWind: map[string]string{}}
	var names []string
	for name := range ratelimit.DefaultPolicies() {
		names = append(names, name)
	}
	sort.Strings(names)
	var spec []string
	for i, name := range names {
		limit := 2
		if name == ratelimit.PolicyGlobal || name == ratelimit.PolicyGetRepo {
			limit = global
		}
		hours := i + 1
		tl.limit[name] = limit
		tl.byWind[strconv.Itoa(hours*3600)] = name
		spec = append(spec, fmt.Sprintf("%s=%d/%dh", name, limit, hours))
	}
	tl.flag = strings.Join(spec, ";")
	return tl
}

// policyOf names the policy of a 429's RateLimit-Policy header, or "".
func (tl *tinyLimits) policyOf(h http.Header) string {
	_, w, ok := strings.Cut(h.Get(ratelimit.HeaderPolicy), ";w=")
	if !ok {
		return ""
	}
	return tl.byWind[w]
}

// nextSource numbers the client addresses handed out in this process.
var nextSource atomic.Uint32

// newSourceClient is an HTTP client whose connections come from a
// loopback address of its own (127.1.0.0/16 and up), so that the server's
// per-address limits see a new client. It follows no redirects.
func newSourceClient() *http.Client {
	n := nextSource.Add(1)
	ip := net.IPv4(127, byte(1+n>>16), byte(n>>8), byte(n))
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 10 * time.Second}
	return &http.Client{
		Transport:     &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 2},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       time.Minute,
	}
}

// concreteRoute is a route of the table as a request: its verb and a path
// that reaches it.
type concreteRoute struct {
	route  pds.PublicRoute
	method string
	path   string
}

func (c concreteRoute) String() string { return c.method + " " + c.path }

// wildcard matches a pattern's wildcards ({did}, {rest...}).
var wildcard = regexp.MustCompile(`\{([A-Za-z_]+)(\.\.\.)?\}`)

// unknownSegment fills the open end of a prefix pattern ("/oauth/"): a
// path no other pattern serves, a valid NSID under /xrpc/.
const unknownSegment = "zz.example.unknown"

// plausibleDID is a did:plc nobody has.
const plausibleDID = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"

// concretize turns each route into a request that reaches it, dropping
// the patterns of a mounted handler that no path under its mount reaches
// (the development PLC's own root), and duplicates.
func concretize(routes []pds.PublicRoute) []concreteRoute {
	seen := map[string]bool{}
	var out []concreteRoute
	for _, r := range routes {
		method, path, ok := strings.Cut(r.Pattern, " ")
		if !ok {
			method, path = http.MethodGet, r.Pattern
		}
		exact := strings.HasSuffix(path, "{$}")
		path = strings.TrimSuffix(path, "{$}")
		if prefix, ok := strings.CutSuffix(path, "*"); ok {
			path = prefix + strings.TrimPrefix(plausibleDID, "did:plc:")
		}
		path = wildcard.ReplaceAllStringFunc(path, func(w string) string {
			switch wildcard.FindStringSubmatch(w)[1] {
			case "did":
				return plausibleDID
			case "seq":
				return "1"
			}
			return "x"
		})
		if strings.HasSuffix(path, "/") && !exact {
			path += unknownSegment
		}
		if r.Mount != "" && !strings.HasPrefix(path, r.Mount) {
			continue
		}
		c := concreteRoute{route: r, method: method, path: path}
		if !seen[c.String()] {
			seen[c.String()] = true
			out = append(out, c)
		}
	}
	return out
}

// burstResult is what a burst at one route met.
type burstResult struct {
	route concreteRoute
	// allowed counts the answers before the first 429; refused is that
	// 429's policy ("" without a recognisable RateLimit-Policy header),
	// limited whether one came at all.
	allowed int
	limited bool
	refused string
	// statuses counts the answers by status.
	statuses map[int]int
	problem  string
}

// burst sends requests made by next (i counts from 0) from one new client
// address until one is answered 429 or max have been sent.
func burst(ps *publicServer, tl *tinyLimits, c concreteRoute, max int, next func(i int) *http.Request) burstResult {
	client := newSourceClient()
	defer client.CloseIdleConnections()
	res := burstResult{route: c, statuses: map[int]int{}}
	for i := 0; i < max; i++ {
		req := next(i)
		resp, err := client.Do(req)
		if err != nil {
			res.problem = fmt.Sprintf("%s: request %d: %v", c, i, err)
			return res
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		res.statuses[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			res.limited = true
			res.refused = tl.policyOf(resp.Header)
			if resp.Header.Get(ratelimit.HeaderRetryAfter) == "" {
				res.problem = fmt.Sprintf("%s: 429 without Retry-After", c)
			}
			return res
		}
		res.allowed++
	}
	return res
}

// requestTo is a request to c on ps: POST with body (as JSON), others
// without.
func requestTo(ps *publicServer, c concreteRoute, body string) *http.Request {
	var rd io.Reader
	if c.method == http.MethodPost {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(c.method, ps.url+c.path, rd)
	if err != nil {
		panic(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// inParallel runs f for each item on a few workers.
func inParallel[T any](items []T, workers int, f func(T)) {
	ch := make(chan T)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for it := range ch {
				f(it)
			}
		})
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
}

// fakeAppView answers every request with an empty JSON object: the
// service proxy's default target in these tests.
func fakeAppView(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
