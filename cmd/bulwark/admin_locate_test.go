package main

import (
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/serverid"
)

// recorder is an HTTP server that keeps every request it gets, whole, and
// answers what next answers (404 without next).
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string
}

func newRecorder(t *testing.T, next http.Handler) *recorder {
	t.Helper()
	r := &recorder{}
	if next == nil {
		next = http.NotFoundHandler()
	}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		dump, _ := httputil.DumpRequest(req, true)
		r.mu.Lock()
		r.seen = append(r.seen, string(dump))
		r.mu.Unlock()
		next.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

// requireNoPassword checks that no request carried credentials or the
// password, in the clear or as HTTP Basic.
func (r *recorder) requireNoPassword(t *testing.T, password string) {
	t.Helper()
	basic := base64.StdEncoding.EncodeToString([]byte("admin:" + password))
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, req := range r.seen {
		require.NotContains(t, strings.ToLower(req), "authorization:", req)
		require.NotContains(t, req, password)
		require.NotContains(t, req, basic)
	}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// TestAdminFindsItsOwnServer: `bulwark admin` goes to the server of its
// data directory, whatever the environment's listen address says, and
// sends the admin password to no other program: not one on the address
// the environment names, not one --url names, not one relaying to the real
// server, not one on the address of a server that has stopped.
func TestAdminFindsItsOwnServer(t *testing.T) {
	s := startLiveServer(t, serverOptions{})
	pw := s.adminPassword(t)
	fake := newRecorder(t, nil)
	t.Setenv("BULWARK_ADMIN_URL", "")
	t.Setenv("BULWARK_ADMIN_PASSWORD", "")
	// The operator's environment names another listen address than the
	// one the server was started with (--listen): a program is there.
	t.Setenv("BULWARK_LISTEN", strings.TrimPrefix(fake.URL, "http://"))

	code, out, errOut := cli("admin", "--data-dir", s.dataDir, "account", "list")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "HANDLE")
	require.Zero(t, fake.count(), "nothing goes to the listen address of the environment")

	// --url naming another program, with the data directory: refused
	// after a question that carries nothing.
	code, _, errOut = cli("admin", "--url", fake.URL, "--data-dir", s.dataDir, "account", "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "is not the server of data directory "+s.dataDir)
	require.Contains(t, errOut, "the admin password was not sent")
	require.Equal(t, 1, fake.count(), "one identity question")
	fake.requireNoPassword(t, pw)

	// A program relaying everything to the real server: the server proves
	// itself only for its own addresses, so the relay gets no proof to
	// pass on and no password.
	target, err := url.Parse(s.url)
	require.NoError(t, err)
	relay := newRecorder(t, httputil.NewSingleHostReverseProxy(target))
	code, _, errOut = cli("admin", "--url", relay.URL, "--data-dir", s.dataDir, "account", "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "NotThisServer")
	relay.requireNoPassword(t, pw)

	// The server stops: its record goes, and admin says what is missing.
	s.stop(t)
	require.NoFileExists(t, filepath.Join(s.dataDir, serverid.RuntimeFile))
	code, _, errOut = cli("admin", "--data-dir", s.dataDir, "account", "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "cannot find the server of data directory "+s.dataDir+": no running server recorded")

	// A record left by a server that died: nothing answers there.
	dead := serverid.NewRuntime("http://127.0.0.1:1", "http://localhost:1", "did:web:localhost%3A1")
	require.NoError(t, dead.Write(s.dataDir))
	code, _, errOut = cli("admin", "--data-dir", s.dataDir, "audit")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "cannot reach the server of data directory "+s.dataDir+" at http://127.0.0.1:1")
	require.Contains(t, errOut, "is it still running?")

	// A record left by a server that died, whose address another
	// program has taken: refused, nothing sent.
	rt := serverid.NewRuntime(fake.URL, "http://localhost:1", "did:web:localhost%3A1")
	require.NoError(t, rt.Write(s.dataDir))
	code, _, errOut = cli("admin", "--data-dir", s.dataDir, "audit")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "is not the server of data directory")
	fake.requireNoPassword(t, pw)
	require.NoError(t, os.Remove(filepath.Join(s.dataDir, serverid.RuntimeFile)))

	// --url with no record in the data directory: used as given, and
	// admin says so.
	code, _, errOut = cli("admin", "--url", fake.URL, "--data-dir", s.dataDir, "account", "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "cannot be checked to be its server")
}

// TestIdentifyEndpoint: the identity question of a running server, asked
// as an anonymous client: bounded, and answered only for the server's own
// addresses.
func TestIdentifyEndpoint(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{})
	rt, err := serverid.ReadRuntime(s.dataDir)
	require.NoError(t, err)
	ask := func(q url.Values) (int, string) {
		resp, err := http.Get(s.url + serverid.IdentifyPath + "?" + q.Encode())
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	nonce := strings.Repeat("a", 32)
	for _, q := range []url.Values{
		{"url": {s.url}},
		{"url": {s.url}, "nonce": {"short"}},
		{"url": {s.url}, "nonce": {strings.Repeat("a", 129)}},
		{"url": {s.url}, "nonce": {nonce + "!"}},
		{"url": {s.url + "/xrpc"}, "nonce": {nonce}},
		{"url": {strings.Repeat("h", 600)}, "nonce": {nonce}},
	} {
		code, body := ask(q)
		require.Equal(t, http.StatusBadRequest, code, "%v: %s", q, body)
		require.Contains(t, body, "InvalidRequest")
	}
	code, body := ask(url.Values{"url": {"http://127.0.0.1:1"}, "nonce": {nonce}})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "NotThisServer")
	require.NotContains(t, body, rt.Key)

	code, body = ask(url.Values{"url": {s.url}, "nonce": {nonce}})
	require.Equal(t, http.StatusOK, code, body)
	want, err := rt.Proof(s.url, nonce)
	require.NoError(t, err)
	require.Contains(t, body, want)
	require.NotContains(t, body, rt.Key)
	info, err := os.Stat(filepath.Join(s.dataDir, serverid.RuntimeFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the proof key is the owner's only")
}
