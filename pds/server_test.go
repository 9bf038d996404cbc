package pds

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// bundle is what setup gives a test.
type bundle struct {
	server *Server
	cfg    *config.Config
	url    string // base URL of the running httptest server
}

// setup starts the real handler on a fresh database. configure may adjust
// the configuration; register may add test-only methods (before the first
// request, as routes does).
func setup(t *testing.T, configure func(*config.Config), register func(*Server)) *bundle {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	if configure != nil {
		configure(cfg)
	}
	require.NoError(t, cfg.Finalize())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(Options{Config: cfg, DB: dbtest.New(t), Logger: logger, Version: "test"})
	require.NoError(t, err)
	if register != nil {
		register(s)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return &bundle{server: s, cfg: cfg, url: ts.URL}
}

// do sends a request and returns the response with its body read.
func do(t *testing.T, method, url string, body io.Reader, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// requireXRPCError checks that a response is the XRPC error shape with the
// given status and name.
func requireXRPCError(t *testing.T, resp *http.Response, body []byte, status int, name string) xrpcErrorBody {
	t.Helper()
	require.Equal(t, status, resp.StatusCode, "body: %s", body)
	require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"), resp.Header.Get("Content-Type"))
	var e xrpcErrorBody
	require.NoError(t, json.Unmarshal(body, &e), "body: %s", body)
	require.Equal(t, name, e.Error)
	require.NotEmpty(t, e.Message)
	return e
}

type echoInput struct {
	Text  string `json:"text"`
	Count int    `json:"count"`
}

// testMethods registers the test-only methods used below.
func testMethods(s *Server) {
	s.procedure("io.bulwark.test.echo", func(w http.ResponseWriter, r *http.Request) error {
		var in echoInput
		if err := decodeJSON(r, &in); err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, in)
	})
	s.procedure("io.bulwark.test.small", func(w http.ResponseWriter, r *http.Request) error {
		var in echoInput
		if err := decodeJSON(r, &in); err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, in)
	}, withMaxBody(1024))
	s.query("io.bulwark.test.panic", func(w http.ResponseWriter, r *http.Request) error {
		panic("boom")
	})
	s.query("io.bulwark.test.fail", func(w http.ResponseWriter, r *http.Request) error {
		return io.ErrUnexpectedEOF // an unexpected, unmapped error
	})
	s.query("io.bulwark.test.params", func(w http.ResponseWriter, r *http.Request) error {
		p := queryParams(r)
		did := p.did("did")
		limit := p.intParam("limit", 50, 1, 100)
		reverse := p.boolParam("reverse", false)
		cursor := p.optional("cursor")
		if err := p.Err(); err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, map[string]any{"did": did, "limit": limit, "reverse": reverse, "cursor": cursor})
	})
	s.query("io.bulwark.test.stream", func(w http.ResponseWriter, r *http.Request) error {
		return writeJSON(w, http.StatusOK, map[string]string{"ok": "yes"})
	}, longRunning())
}

func TestRouting(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, testMethods)
	xrpc := b.url + "/xrpc/"

	t.Run("unknown method", func(t *testing.T) {
		t.Parallel()
		for _, path := range []string{"com.example.nothing", "app.bsky.feed.getTimeline", "not-an-nsid", ""} {
			resp, body := do(t, http.MethodGet, xrpc+path, nil, nil)
			requireXRPCError(t, resp, body, http.StatusNotImplemented, "MethodNotImplemented")
			resp, body = do(t, http.MethodPost, xrpc+path, strings.NewReader("{}"), nil)
			requireXRPCError(t, resp, body, http.StatusNotImplemented, "MethodNotImplemented")
		}
	})

	t.Run("GET on a procedure", func(t *testing.T) {
		t.Parallel()
		resp, body := do(t, http.MethodGet, xrpc+"io.bulwark.test.echo", nil, nil)
		requireXRPCError(t, resp, body, http.StatusMethodNotAllowed, "InvalidRequest")
		require.Equal(t, "POST", resp.Header.Get("Allow"))
	})

	t.Run("POST on a query", func(t *testing.T) {
		t.Parallel()
		resp, body := do(t, http.MethodPost, xrpc+"com.atproto.server.describeServer", strings.NewReader("{}"), nil)
		requireXRPCError(t, resp, body, http.StatusMethodNotAllowed, "InvalidRequest")
		require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	})

	t.Run("PUT anywhere", func(t *testing.T) {
		t.Parallel()
		resp, body := do(t, http.MethodPut, xrpc+"io.bulwark.test.echo", strings.NewReader("{}"), nil)
		requireXRPCError(t, resp, body, http.StatusMethodNotAllowed, "InvalidRequest")
	})

	t.Run("HEAD takes the GET path", func(t *testing.T) {
		t.Parallel()
		get, getBody := do(t, http.MethodGet, xrpc+"com.atproto.server.describeServer", nil, nil)
		head, headBody := do(t, http.MethodHead, xrpc+"com.atproto.server.describeServer", nil, nil)
		require.Equal(t, http.StatusOK, head.StatusCode)
		require.Empty(t, headBody)
		require.Equal(t, get.Header.Get("Content-Length"), head.Header.Get("Content-Length"))
		require.Equal(t, get.Header.Get("Content-Type"), head.Header.Get("Content-Type"))
		require.NotEmpty(t, getBody)
	})

	t.Run("echo", func(t *testing.T) {
		t.Parallel()
		resp, body := do(t, http.MethodPost, xrpc+"io.bulwark.test.echo", strings.NewReader(`{"text":"hi","count":3,"extra":true}`),
			http.Header{"Content-Type": {"application/json; charset=utf-8"}})
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		require.JSONEq(t, `{"text":"hi","count":3}`, string(body))
	})

	t.Run("long running", func(t *testing.T) {
		t.Parallel()
		resp, body := do(t, http.MethodGet, xrpc+"io.bulwark.test.stream", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	})
}

func TestBadBodies(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.Config) { c.MaxJSONBody = 4096 }, testMethods)
	echo := b.url + "/xrpc/io.bulwark.test.echo"
	jsonCT := http.Header{"Content-Type": {"application/json"}}

	big := `{"text":"` + strings.Repeat("a", 5000) + `"}`
	tests := []struct {
		name   string
		url    string
		body   io.Reader
		header http.Header
		status int
		errore string
		msg    string
	}{
		{"declared length over the limit", echo, strings.NewReader(big), jsonCT, 413, "PayloadTooLarge", "limit"},
		// No Content-Length: the limit is found while reading.
		{"chunked body over the limit", echo, io.MultiReader(strings.NewReader(big)), jsonCT, 413, "PayloadTooLarge", "larger than 4096"},
		{"per-method limit", b.url + "/xrpc/io.bulwark.test.small", strings.NewReader(`{"text":"` + strings.Repeat("a", 2000) + `"}`), jsonCT, 413, "PayloadTooLarge", "1024"},
		{"malformed JSON", echo, strings.NewReader(`{"text": nope}`), jsonCT, 400, "InvalidRequest", "malformed JSON"},
		{"truncated JSON", echo, strings.NewReader(`{"text": "a`), jsonCT, 400, "InvalidRequest", "truncated"},
		{"empty body", echo, strings.NewReader(``), jsonCT, 400, "InvalidRequest", "empty"},
		{"wrong field type", echo, strings.NewReader(`{"count":"three"}`), jsonCT, 400, "InvalidRequest", `"count"`},
		{"not an object", echo, strings.NewReader(`[1,2]`), jsonCT, 400, "InvalidRequest", "want a JSON"},
		{"two values", echo, strings.NewReader(`{} {}`), jsonCT, 400, "InvalidRequest", "more than one"},
		{"wrong content type", echo, strings.NewReader(`{}`), http.Header{"Content-Type": {"text/plain"}}, 400, "InvalidRequest", "application/json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp, body := do(t, http.MethodPost, tt.url, tt.body, tt.header)
			e := requireXRPCError(t, resp, body, tt.status, tt.errore)
			require.Contains(t, e.Message, tt.msg)
		})
	}
}

func TestParams(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, testMethods)
	u := b.url + "/xrpc/io.bulwark.test.params?"

	resp, body := do(t, http.MethodGet, u+"did=did:plc:abc123&limit=7&reverse=true", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.JSONEq(t, `{"did":"did:plc:abc123","limit":7,"reverse":true,"cursor":""}`, string(body))

	tests := []struct{ query, mention string }{
		{"", `"did"`},
		{"did=nope", `"did"`},
		{"did=did:plc:abc&limit=0", `"limit"`},
		{"did=did:plc:abc&limit=101", `"limit"`},
		{"did=did:plc:abc&limit=ten", `"limit"`},
		{"did=did:plc:abc&reverse=yes", `"reverse"`},
	}
	for _, tt := range tests {
		resp, body := do(t, http.MethodGet, u+tt.query, nil, nil)
		e := requireXRPCError(t, resp, body, http.StatusBadRequest, "InvalidRequest")
		require.Contains(t, e.Message, tt.mention, tt.query)
	}
}

func TestFailures(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, testMethods)

	resp, body := do(t, http.MethodGet, b.url+"/xrpc/io.bulwark.test.panic", nil, nil)
	e := requireXRPCError(t, resp, body, http.StatusInternalServerError, "InternalServerError")
	require.NotContains(t, e.Message, "boom", "panic values stay in the log")

	resp, body = do(t, http.MethodGet, b.url+"/xrpc/io.bulwark.test.fail", nil, nil)
	e = requireXRPCError(t, resp, body, http.StatusInternalServerError, "InternalServerError")
	require.NotContains(t, e.Message, "EOF", "internal errors stay in the log")

	// The server is still serving after a panic.
	resp, _ = do(t, http.MethodGet, b.url+"/xrpc/_health", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestDescribeServer(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil)
		resp, body := do(t, http.MethodGet, b.url+"/xrpc/com.atproto.server.describeServer", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		require.JSONEq(t, `{
			"did": "did:web:localhost%3A2583",
			"availableUserDomains": [".test"],
			"inviteCodeRequired": false,
			"phoneVerificationRequired": false,
			"blobUploadLimit": 104857600,
			"emailAvailable": false
		}`, string(body))
	})
	t.Run("configured", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *config.Config) {
			c.Hostname = "pds.example.com"
			c.HandleDomains = []string{".example.com", ".example.org"}
			c.InviteRequired = true
			c.ContactEmail = "admin@example.com"
			c.PrivacyPolicyURL = "https://example.com/privacy"
			c.TermsOfServiceURL = "https://example.com/tos"
		}, nil)
		resp, body := do(t, http.MethodGet, b.url+"/xrpc/com.atproto.server.describeServer", nil, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		require.JSONEq(t, `{
			"did": "did:web:pds.example.com",
			"availableUserDomains": [".example.com", ".example.org"],
			"inviteCodeRequired": true,
			"phoneVerificationRequired": false,
			"links": {"privacyPolicy": "https://example.com/privacy", "termsOfService": "https://example.com/tos"},
			"contact": {"email": "admin@example.com"},
			"blobUploadLimit": 104857600,
			"emailAvailable": false
		}`, string(body))
	})
}

func TestHealth(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	b := setup(t, nil, func(s *Server) { s.health.now = func() time.Time { return time.Unix(0, clock.Load()) } })
	pings := func() int {
		b.server.health.mu.Lock()
		defer b.server.health.mu.Unlock()
		return b.server.health.pings
	}
	health := func() (int, string) {
		resp, body := do(t, http.MethodGet, b.url+"/xrpc/_health", nil, nil)
		return resp.StatusCode, string(body)
	}
	status, body := health()
	require.Equal(t, http.StatusOK, status, body)
	require.JSONEq(t, `{"version":"test","database":"ok"}`, body)

	// A flood of checks within healthCacheTTL costs one ping in all: the
	// method has no per-address limit.
	for range 50 {
		status, _ := health()
		require.Equal(t, http.StatusOK, status)
	}
	require.Equal(t, 1, pings())

	// With the pool gone the next ping fails, and the check says so with
	// a 503.
	b.server.db.Close()
	status, _ = health()
	require.Equal(t, http.StatusOK, status, "within the TTL: the last ping's answer")
	clock.Add(int64(healthCacheTTL))
	status, body = health()
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	require.JSONEq(t, `{"version":"test","database":"unreachable"}`, body)
	require.Equal(t, 2, pings())
}

func TestCORS(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)
	resp, body := do(t, http.MethodOptions, b.url+"/xrpc/com.atproto.repo.createRecord", nil, http.Header{
		"Origin":                         {"https://bsky.app"},
		"Access-Control-Request-Method":  {"POST"},
		"Access-Control-Request-Headers": {"authorization,content-type,atproto-proxy,atproto-accept-labelers,dpop"},
	})
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Empty(t, body)
	require.Equal(t, "*", resp.Header.Get("Access-Control-Allow-Origin"))
	require.Contains(t, resp.Header.Get("Access-Control-Allow-Methods"), "POST")
	allowed := strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers"))
	for _, h := range []string{"authorization", "content-type", "atproto-proxy", "atproto-accept-labelers", "dpop"} {
		require.Contains(t, allowed, h)
	}

	// Ordinary responses, errors included, are readable cross-origin.
	resp, body = do(t, http.MethodGet, b.url+"/xrpc/com.example.nothing", nil, http.Header{"Origin": {"https://bsky.app"}})
	requireXRPCError(t, resp, body, http.StatusNotImplemented, "MethodNotImplemented")
	require.Equal(t, "*", resp.Header.Get("Access-Control-Allow-Origin"))
	require.Contains(t, strings.ToLower(resp.Header.Get("Access-Control-Expose-Headers")), "ratelimit-remaining")
}

func TestPagesAndRequestID(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil)

	resp, body := do(t, http.MethodGet, b.url+"/", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "Bulwark")
	require.NotEmpty(t, resp.Header.Get("X-Request-Id"))

	resp, body = do(t, http.MethodGet, b.url+"/robots.txt", nil, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), "Disallow: /")

	resp, body = do(t, http.MethodGet, b.url+"/nothing/here", nil, nil)
	requireXRPCError(t, resp, body, http.StatusNotFound, "NotFound")

	resp, _ = do(t, http.MethodGet, b.url+"/", nil, http.Header{"X-Request-Id": {"abc-123"}})
	require.Equal(t, "abc-123", resp.Header.Get("X-Request-Id"))
	resp, _ = do(t, http.MethodGet, b.url+"/", nil, http.Header{"X-Request-Id": {"<script>"}})
	require.NotEqual(t, "<script>", resp.Header.Get("X-Request-Id"))
}

func TestAccessLogHasNoSecrets(t *testing.T) {
	t.Parallel()
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	require.NoError(t, cfg.Finalize())
	var logs bytes.Buffer // ServeHTTP below runs synchronously: no lock needed
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := New(Options{Config: cfg, DB: dbtest.New(t), Logger: logger})
	require.NoError(t, err)

	req := httptest.NewRequest(http.MethodGet, "/xrpc/com.atproto.server.describeServer?token=querysecret", nil)
	req.Header.Set("Authorization", "Bearer headersecret")
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code)

	out := logs.String()
	require.Contains(t, out, `"path":"/xrpc/com.atproto.server.describeServer"`)
	require.Contains(t, out, `"status":200`)
	require.NotContains(t, out, "headersecret")
	require.NotContains(t, out, "querysecret")
}

func TestClientIP(t *testing.T) {
	t.Parallel()
	cfg := config.DefaultConfig()
	cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	s := &Server{cfg: cfg}
	tests := []struct {
		remote string
		xff    []string
		want   string
	}{
		{"192.0.2.1:1234", nil, "192.0.2.1"},
		{"192.0.2.1:1234", []string{"198.51.100.7"}, "192.0.2.1"}, // untrusted peer: header ignored
		{"10.0.0.5:1234", []string{"198.51.100.7"}, "198.51.100.7"},
		{"10.0.0.5:1234", []string{"203.0.113.9, 198.51.100.7, 10.0.0.9"}, "198.51.100.7"}, // forged left part ignored
		{"10.0.0.5:1234", []string{"203.0.113.9", "198.51.100.7"}, "198.51.100.7"},
		{"10.0.0.5:1234", []string{"garbage"}, "10.0.0.5"},
		{"[::ffff:192.0.2.1]:1234", nil, "192.0.2.1"},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tt.remote
		for _, v := range tt.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		require.Equal(t, tt.want, s.clientIP(r).String(), "%s %v", tt.remote, tt.xff)
	}
}
