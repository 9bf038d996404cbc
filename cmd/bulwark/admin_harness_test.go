package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// liveServer is `bulwark serve` running in this process on a real port,
// with accounts on a local PLC directory: what the admin CLI and backups
// are tested against.
type liveServer struct {
	url         string // http://127.0.0.1:<port>
	hostname    string
	dataDir     string
	databaseURL string // "" for the managed cluster
	// lastRKey is the record key of the last createRecord.
	lastRKey string
	cancel   context.CancelFunc
	done     <-chan int
	logs     *syncbuf.Buffer
}

// serverOptions configure startLiveServer.
type serverOptions struct {
	// dataDir is the data dir; "" means a fresh t.TempDir().
	dataDir string
	// databaseURL is an external database; "" means a fresh test
	// database (dbtest), unless managed.
	databaseURL string
	// managed runs the managed cluster in dataDir, which must then be
	// reachable by the postgres user when running as root (managedDataDir).
	managed bool
	// hostname defaults to localhost:<port>.
	hostname string
	// plcURL defaults to a fresh local PLC directory.
	plcURL string
	// extra are more serve flags.
	extra []string
}

func startLiveServer(t *testing.T, o serverOptions) *liveServer {
	t.Helper()
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	if o.plcURL == "" {
		_, plc := plctest.NewServer(t)
		o.plcURL = plc.URL
	}
	port := freePort(t)
	if o.hostname == "" {
		o.hostname = "localhost:" + strconv.Itoa(port)
	}
	args := []string{"serve",
		"--listen", "127.0.0.1:" + strconv.Itoa(port),
		"--hostname", o.hostname,
		"--data-dir", o.dataDir,
		"--plc-url", o.plcURL,
		"--log-format", "text",
		"--ratelimits", "off",
		"--firehose-allow", "127.0.0.0/8",
	}
	if o.databaseURL == "" && !o.managed {
		o.databaseURL = dbtest.NewURL(t)
	}
	if o.databaseURL != "" {
		args = append(args, "--database-url", o.databaseURL)
	}
	args = append(args, o.extra...)
	ctx, cancel := context.WithCancel(context.Background())
	addr, done, logs := startServe(t, ctx, args)
	s := &liveServer{url: "http://" + addr, hostname: o.hostname, dataDir: o.dataDir, databaseURL: o.databaseURL, cancel: cancel, done: done, logs: logs}
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop ends the server (as SIGTERM would) and waits for it; once stopped,
// a second call does nothing.
func (s *liveServer) stop(t *testing.T) {
	t.Helper()
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.cancel = nil
	select {
	case code := <-s.done:
		require.Equal(t, 0, code, s.logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
}

// adminPassword is the password the server generated into its data dir.
func (s *liveServer) adminPassword(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dataDir, config.SecretsDir, "admin-password"))
	require.NoError(t, err)
	return string(bytes.TrimSpace(b))
}

// cli runs `bulwark args...` in this process.
func cli(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// admin runs `bulwark admin --url <server> args...`; the password comes
// from the server's data dir, as on the server's own machine.
func (s *liveServer) admin(t *testing.T, args ...string) (stdout string) {
	t.Helper()
	all := append([]string{"admin", "--url", s.url, "--data-dir", s.dataDir}, args...)
	code, out, errOut := cli(all...)
	require.Equal(t, 0, code, "bulwark %v: %s", all, errOut)
	return out
}

// adminJSON is admin with --json, decoding the output into v.
func (s *liveServer) adminJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := s.admin(t, append(args, "--json")...)
	require.NoError(t, json.Unmarshal([]byte(out), v), "output: %s", out)
}

// xrpc calls a method and decodes a JSON answer into out (nil: ignored); it
// returns the status and the raw body.
func (s *liveServer) xrpc(t *testing.T, method, nsid, token string, q url.Values, body, out any) (int, []byte) {
	t.Helper()
	u := s.url + "/xrpc/" + nsid
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	ct := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		rd, ct = bytes.NewReader(b), "application/octet-stream"
	default:
		raw, err := json.Marshal(b)
		require.NoError(t, err)
		rd, ct = bytes.NewReader(raw), "application/json"
	}
	req, err := http.NewRequest(method, u, rd)
	require.NoError(t, err)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && resp.StatusCode == http.StatusOK {
		require.NoError(t, json.Unmarshal(raw, out), "%s: %s", nsid, raw)
	}
	return resp.StatusCode, raw
}

// login creates a session and returns its access token; the status is
// returned for a refused login.
func (s *liveServer) login(t *testing.T, identifier, password string) (string, int) {
	t.Helper()
	var sess struct {
		AccessJwt string `json:"accessJwt"`
	}
	status, _ := s.xrpc(t, http.MethodPost, "com.atproto.server.createSession", "", nil,
		map[string]string{"identifier": identifier, "password": password}, &sess)
	return sess.AccessJwt, status
}

// postOK makes an XRPC procedure call to the server at base and requires
// a 200; it returns the JSON answer.
func postOK(t *testing.T, base, nsid, token string, in any) map[string]any {
	t.Helper()
	b, err := json.Marshal(in)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, base+"/xrpc/"+nsid, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", nsid, body)
	var out map[string]any
	_ = json.Unmarshal(body, &out)
	return out
}
