package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// startServe runs `bulwark serve` with args in this process until ctx
// ends, and waits for it to listen: it returns the address, the channel
// that gets its exit code, and its log.
func startServe(t *testing.T, ctx context.Context, args []string) (string, <-chan int, *syncbuf.Buffer) {
	t.Helper()
	done := make(chan int, 1)
	logs := &syncbuf.Buffer{}
	go func() { done <- run(ctx, args, io.Discard, logs) }()
	addrRE := regexp.MustCompile(`msg=serving addr=(\S+)`)
	// Polled here, on the test's goroutine, so that t.Fatalf may stop it.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(waitLimit)
	for {
		if m := addrRE.FindStringSubmatch(logs.String()); m != nil {
			return m[1], done, logs
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited with %d: %s", code, logs.String())
		case <-limit:
			t.Fatalf("serve never logged its address: %s", logs.String())
		case <-tick.C:
		}
	}
}

// waitLimit guards every wait below so that a broken server fails the test
// instead of hanging it. It is generous (initdb and crash recovery on a
// loaded CI machine) and is not a performance assertion.
const waitLimit = 3 * time.Minute

func TestRunUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		args []string
		code int
		out  string // expected in stdout+stderr
	}{
		{nil, 2, "Usage"},
		{[]string{"version"}, 0, "bulwark "},
		{[]string{"help"}, 0, "bulwark serve"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"serve", "--listen", "nowhere"}, 2, "--listen"},
		{[]string{"serve", "--hostname", "https://x.example"}, 2, "BULWARK_HOSTNAME"},
		{[]string{"serve", "extra"}, 2, "unexpected arguments"},
		{[]string{"serve", "--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"migrate"}, 2, "up|status"},
		{[]string{"migrate", "sideways"}, 2, "up|status"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		code := run(ctx, tt.args, &out, &out)
		require.Equal(t, tt.code, code, "%v: %s", tt.args, out.String())
		require.Contains(t, out.String(), tt.out, "%v", tt.args)
	}
}

// TestExternalDatabase runs migrate and serve in-process against a
// database given by URL: no managed cluster may appear in the data dir.
func TestExternalDatabase(t *testing.T) {
	t.Parallel()
	// The test server trusts socket connections, so the password is
	// ignored by Postgres; it is there to check that no log shows it.
	u, err := neturl.Parse(dbtest.NewURL(t))
	require.NoError(t, err)
	u.User = neturl.UserPassword(u.User.Username(), "sekrit-pw")
	url := u.String()
	dataDir := t.TempDir()
	base := []string{"--database-url", url, "--data-dir", dataDir, "--listen", "127.0.0.1:0"}

	var out, errs syncbuf.Buffer
	require.Equal(t, 0, run(context.Background(), append([]string{"migrate", "up"}, base...), &out, &errs), errs.String())
	require.Equal(t, 0, run(context.Background(), append([]string{"migrate", "status"}, base...), &out, &errs), errs.String())
	require.Contains(t, out.String(), "00001")
	require.NotContains(t, out.String(), "pending")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done, logs := startServe(t, ctx, append([]string{"serve"}, base...))

	resp, err := http.Get("http://" + addr + "/xrpc/_health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	cancel() // as SIGTERM would
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
	require.NoDirExists(t, filepath.Join(dataDir, ManagedPostgresDir), "no managed cluster with a database URL")
	require.NotContains(t, logs.String()+errs.String(), "sekrit-pw", "the database URL is logged redacted")
}

// TestServeLifecycle builds the binary and runs it the way an operator
// does, on the managed Postgres: start, SIGTERM, start again on the same
// data, kill -9 (leaving an orphaned postmaster and a stale pid file), start
// again.
func TestServeLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the serve lifecycle test (builds the binary and runs Postgres clusters) in -short mode")
	}
	t.Parallel()

	bin := filepath.Join(t.TempDir(), "bulwark")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "go build")

	// Under root, Postgres runs as another user, which must be able to
	// traverse every directory above the cluster; MkdirTemp makes 0700.
	root, err := os.MkdirTemp("", "bulwark-serve-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(root, 0o711))
	dataDir := filepath.Join(root, "data")
	t.Cleanup(func() {
		stopOrphanedPostgres(t, dataDir)
		_ = os.RemoveAll(root)
	})

	port := freePort(t)
	env := append(cleanEnv(),
		"BULWARK_DATA_DIR="+dataDir,
		"BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(port),
		"BULWARK_HOSTNAME=localhost:"+strconv.Itoa(port),
		"BULWARK_LOG_FORMAT=text",
	)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)

	lc := &lifecycle{t: t, bin: bin, env: env, base: base, port: port, dataDir: dataDir}

	// First start: initdb, migrate, secrets generated.
	p := lc.start("first start")
	pw := lc.secret()

	// A second server on the same data dir (another port) stops at the
	// data dir's lock, before touching it; the first one keeps serving.
	second := exec.Command(bin, "serve")
	second.Env = append(append([]string(nil), env...), "BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(freePort(t)))
	out, err := second.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "is in use by another bulwark server")
	require.NotContains(t, string(out), "initialised postgres cluster")
	_, ok := describe(base)
	require.True(t, ok, "the first server still answers")
	lc.stop("first start", p)
	status := runMigrateStatus(t, bin, env)
	require.Contains(t, status, "00001")
	require.NotContains(t, status, "pending")

	// Clean restart: same cluster, same secrets, nothing re-applied.
	p = lc.start("restart")
	require.NotContains(t, p.logs.String(), "initialised postgres cluster")
	require.Equal(t, pw, lc.secret())
	// kill -9: the postmaster survives as an orphan and pid files stay.
	require.NoError(t, p.cmd.Process.Kill())
	p.wait(t)
	orphan := postmasterPid(t, dataDir)
	require.NotZero(t, orphan, "postmaster.pid survives kill -9")
	require.NoError(t, syscall.Kill(orphan, 0), "the postmaster outlives its parent")

	// Start after the crash: the orphan is dealt with, the data is intact.
	p = lc.start("start after kill -9")
	require.Equal(t, pw, lc.secret())
	require.NotEqual(t, orphan, postmasterPid(t, dataDir), "a new postmaster replaced the orphan")
	lc.stop("start after kill -9", p)
	require.Equal(t, status, runMigrateStatus(t, bin, env), "migrations applied once, at the first start")
}

// lifecycle runs the built binary on one data dir and port.
type lifecycle struct {
	t       *testing.T
	bin     string
	env     []string
	base    string
	port    int
	dataDir string
}

// start runs serve and waits until describeServer answers.
func (lc *lifecycle) start(name string) *proc {
	t := lc.t
	t.Helper()
	p := &proc{cmd: exec.Command(lc.bin, "serve"), done: make(chan struct{})}
	p.cmd.Env = lc.env
	p.cmd.Stdout = &p.logs
	p.cmd.Stderr = &p.logs
	require.NoError(t, p.cmd.Start(), name)
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(waitLimit)
	for {
		if d, ok := describe(lc.base); ok {
			require.Equal(t, "did:web:localhost%3A"+strconv.Itoa(lc.port), d.DID, name)
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("%s: bulwark exited (%v); logs:\n%s", name, p.cmd.ProcessState, p.logs.String())
		case <-limit:
			_ = p.cmd.Process.Kill()
			t.Fatalf("%s: describeServer never answered; logs:\n%s", name, p.logs.String())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM and requires a clean exit.
func (lc *lifecycle) stop(name string, p *proc) {
	t := lc.t
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.wait(t)
	require.True(t, p.cmd.ProcessState.Success(), "%s: exit %v; logs:\n%s", name, p.cmd.ProcessState, p.logs.String())
	require.Contains(t, p.logs.String(), "http server stopped")
}

// secret is the admin password kept in the data dir.
func (lc *lifecycle) secret() string {
	b, err := os.ReadFile(filepath.Join(lc.dataDir, config.SecretsDir, "admin-password"))
	require.NoError(lc.t, err)
	return string(b)
}

type describeOutput struct {
	DID string `json:"did"`
}

func describe(base string) (describeOutput, bool) {
	var d describeOutput
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/xrpc/com.atproto.server.describeServer")
	if err != nil {
		return d, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return d, false
	}
	return d, json.NewDecoder(resp.Body).Decode(&d) == nil
}

func runMigrateStatus(t *testing.T, bin string, env []string) string {
	t.Helper()
	cmd := exec.Command(bin, "migrate", "status")
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	return stdout.String()
}

// proc is a bulwark process under test.
type proc struct {
	cmd  *exec.Cmd
	logs syncbuf.Buffer
	done chan struct{} // closed when the process has exited
}

func (p *proc) wait(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(waitLimit):
		_ = p.cmd.Process.Kill()
		t.Fatalf("bulwark did not exit; logs:\n%s", p.logs.String())
	}
}

// cleanEnv is this process's environment without BULWARK_* settings, which
// would otherwise leak from the developer's shell into the server.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BULWARK_") {
			env = append(env, kv)
		}
	}
	return env
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// postmasterPid reads the pid in the managed cluster's postmaster.pid, or 0.
func postmasterPid(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, ManagedPostgresDir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// stopOrphanedPostgres ends a postmaster a failed test left behind, so that
// it does not outlive the test run.
func stopOrphanedPostgres(t *testing.T, dataDir string) {
	pid := postmasterPid(t, dataDir)
	if pid <= 0 {
		return
	}
	// Only a postmaster of this cluster: its working directory is the
	// cluster's data directory. A stale file may name a reused pid.
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil || cwd != filepath.Join(dataDir, ManagedPostgresDir, "data") {
		return
	}
	if syscall.Kill(pid, syscall.SIGQUIT) == nil {
		t.Logf("stopped orphaned postgres %d", pid)
	}
}
