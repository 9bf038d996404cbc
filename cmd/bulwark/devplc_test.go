package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// recordingProxy is an HTTP(S) proxy that records every connection made
// to it and serves none. A server run with HTTP_PROXY and HTTPS_PROXY
// pointing at it cannot reach any other host through Go's transport
// without the proxy seeing it (requests to loopback are never proxied).
type recordingProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns int
	first string // the first request line, for the failure message
}

func newRecordingProxy(t *testing.T) *recordingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &recordingProxy{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 256)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, _ := c.Read(buf)
			line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
			p.mu.Lock()
			p.conns++
			if p.first == "" {
				p.first = line
			}
			p.mu.Unlock()
			_ = c.Close()
		}
	}()
	return p
}

func (p *recordingProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *recordingProxy) seen() (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns, p.first
}

// proxiedEnv is the test's environment without BULWARK_* settings or
// proxy settings of its own, sending every proxied request to proxy.
func proxiedEnv(proxy *recordingProxy, settings ...string) []string {
	var env []string
	for _, kv := range cleanEnv() {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasSuffix(strings.ToLower(k), "_proxy") {
			env = append(env, kv)
		}
	}
	env = append(env, "HTTP_PROXY="+proxy.URL(), "HTTPS_PROXY="+proxy.URL())
	return append(env, settings...)
}

// startBinary runs `bin serve` with env until the test ends and waits
// until base answers describeServer.
func startBinary(t *testing.T, bin, base string, env []string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, "serve"), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout = &p.logs
	p.cmd.Stderr = &p.logs
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(waitLimit)
	for {
		// The banner and the ready line are written before the server
		// answers, but reach p.logs through exec's copying goroutine: wait
		// for them too.
		if _, ok := describe(base); ok && strings.Contains(p.logs.String(), "bulwark is ready") {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("bulwark exited (%v); logs:\n%s", p.cmd.ProcessState, p.logs.String())
		case <-limit:
			t.Fatalf("describeServer never answered; logs:\n%s", p.logs.String())
		case <-tick.C:
		}
	}
}

// createAccount calls createAccount and returns the status and body.
func createAccount(t *testing.T, base, handle string) (int, map[string]any) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"handle": handle, "email": handle + "@example.com", "password": "a long enough password"})
	resp, err := http.Post(base+"/xrpc/com.atproto.server.createAccount", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// resolvesLikeClients resolves did with the server's URL as PLC URL the
// way clients do: indigo's default directory with its PLCURL replaced
// (what goat --plc-host does), and the percent-encoded path
// @atproto/identity asks for.
func resolvesLikeClients(t *testing.T, base, did string) {
	t.Helper()
	dir := identity.DefaultDirectory()
	dir.(*identity.CacheDirectory).Inner.(*identity.BaseDirectory).PLCURL = base
	ident, err := dir.LookupDID(context.Background(), syntax.DID(did))
	require.NoError(t, err)
	require.Equal(t, base, ident.PDSEndpoint())

	resp, err := http.Get(base + "/" + strings.ReplaceAll(did, ":", "%3A"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bulwark")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "go build")
	return bin
}

// TestDevPLCStaysLocal runs the binary the way `make run` does: local host
// name (derived from the port), no PLC URL. Its banner tells where things
// are; createAccount makes a DID in the development PLC inside the server,
// stored in its database and resolvable at the server's own URL; and not
// one request leaves for another host. A second server pointed at a public
// directory over https shows the proxy does see what leaves.
func TestDevPLCStaysLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	t.Parallel()
	bin := buildBinary(t)
	proxy := newRecordingProxy(t)
	dbURL := dbtest.NewURL(t)
	port := freePort(t)
	base := "http://localhost:" + strconv.Itoa(port)
	dataDir := filepath.Join(t.TempDir(), "data")
	p := startBinary(t, bin, base, proxiedEnv(proxy,
		"BULWARK_DATABASE_URL="+dbURL, "BULWARK_DATA_DIR="+dataDir,
		"BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(port), "BULWARK_LOG_FORMAT=text"))

	// The banner: the URL with the real port, the secrets, the command.
	logs := p.logs.String()
	require.Contains(t, logs, "URL:            "+base+"\n")
	require.Contains(t, logs, "development PLC at "+base)
	for _, f := range []string{"admin-password", "jwt-secret", "plc-rotation-key"} {
		require.Contains(t, logs, f)
	}
	require.Contains(t, logs, filepath.Join(dataDir, "secrets", "admin-password"))
	require.Contains(t, logs, "admin --data-dir "+dataDir+" account create --handle alice.test --email alice@example.com")
	require.NotContains(t, logs, "firehose-max-subscribers", "the full configuration is not logged at info")

	// The first-account command, run exactly as the banner prints it,
	// makes an account whose printed password logs in.
	did := runFirstAccountCommand(t, bin, logs, base)
	resp, err := http.Get(base + "/" + did)
	require.NoError(t, err)
	var doc struct {
		Service []struct{ ServiceEndpoint string } `json:"service"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, base, doc.Service[0].ServiceEndpoint)
	resolvesLikeClients(t, base, did)

	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var ops int
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT count(*) FROM dev_plc_operations WHERE did = $1", did).Scan(&ops))
	require.Equal(t, 1, ops, "the genesis is kept in the server's own database")

	n, first := proxy.seen()
	require.Zero(t, n, "a request left for another host: %s", first)

	// The control: the same binary, told to use a public directory (a PDS
	// URL over https is allowed there), does send through the proxy.
	port2 := freePort(t)
	startBinary(t, bin, "http://127.0.0.1:"+strconv.Itoa(port2), proxiedEnv(proxy,
		"BULWARK_DATABASE_URL="+dbtest.NewURL(t), "BULWARK_DATA_DIR="+filepath.Join(t.TempDir(), "data"),
		"BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(port2), "BULWARK_HOSTNAME=pds.example.com",
		"BULWARK_PLC_URL=https://plc.example.com", "BULWARK_INVITE_REQUIRED=false"))
	status, out := createAccount(t, "http://127.0.0.1:"+strconv.Itoa(port2), "bob.pds.example.com")
	require.Equal(t, http.StatusBadGateway, status, "%v", out)
	n, first = proxy.seen()
	require.Equal(t, 1, n)
	require.Contains(t, first, "plc.example.com:443")
}

// runFirstAccountCommand finds the banner's "First account:" line in logs,
// runs that command as a user would (from a shell, split on spaces), and
// logs in at base with the handle and password it prints. It
// returns the account's DID.
func runFirstAccountCommand(t *testing.T, bin, logs, base string) string {
	t.Helper()
	var line string
	for _, l := range strings.Split(logs, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "First account:"); ok {
			line = strings.TrimSpace(rest)
		}
	}
	args := strings.Fields(line)
	// The banner names the binary as it was started (here bin's path).
	require.True(t, len(args) > 1 && args[0] == bin, "no first-account command for %s in the banner:\n%s", bin, logs)
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	require.NoError(t, err, "%s: %s", line, out)
	fields := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), " "); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	require.NotEmpty(t, fields["Password"], "%s", out)
	body, _ := json.Marshal(map[string]string{"identifier": fields["Handle"], "password": fields["Password"]})
	resp, err := http.Post(base+"/xrpc/com.atproto.server.createSession", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var sess struct{ DID string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&sess))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, fields["DID"], sess.DID)
	return sess.DID
}
