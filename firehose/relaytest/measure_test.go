package relaytest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	relaytesting "github.com/bluesky-social/indigo/cmd/relay/testing"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog/eventlogtest"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/procstat"
)

// TestMeasureRelayIncident measures the incident on a `bulwark serve`
// process, started as the README starts it (managed Postgres, a data dir,
// a local host name), with indigo's relay in this process: the relay
// follows the server, an event is stored over its frame limit (the #sync
// fallback off, as when the incident was reproduced), and it redials.
// Over BULWARK_MEASURE_SECONDS (default 40) of that it counts the server's
// log lines, the relay's connections and the CPU used by the server and
// its Postgres; then it repairs the event and times how long the relay
// takes to pass it. It prints the figures; it asserts nothing about them.
//
// It runs only when BULWARK_MEASURE_BIN names a bulwark binary (build one
// per version to compare). BULWARK_MEASURE_ALLOW=1 allow-lists loopback
// (a known relay: no admission rate); BULWARK_MEASURE_PORT picks the
// server's port (default 31550).
//
//	go build -o /tmp/bulwark-new ./cmd/bulwark
//	BULWARK_MEASURE_BIN=/tmp/bulwark-new go test -run TestMeasureRelayIncident -v ./firehose/relaytest/
func TestMeasureRelayIncident(t *testing.T) {
	bin := os.Getenv("BULWARK_MEASURE_BIN")
	if bin == "" {
		t.Skip("set BULWARK_MEASURE_BIN to a bulwark binary to measure the incident")
	}
	window := 40 * time.Second
	if s, err := strconv.Atoi(os.Getenv("BULWARK_MEASURE_SECONDS")); err == nil && s > 0 {
		window = time.Duration(s) * time.Second
	}
	port := 31550
	if p, err := strconv.Atoi(os.Getenv("BULWARK_MEASURE_PORT")); err == nil {
		port = p
	}
	allow := os.Getenv("BULWARK_MEASURE_ALLOW") == "1"
	relayLogs := recordDefaultLog(t)
	srv := startServeProcess(t, bin, port, allow)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the server's log:\n%s\nthe relay's:\n%s", srv.log, relayLogs)
		}
	})
	ctx := context.Background()

	dir := &identity.BaseDirectory{PLCURL: srv.url, SkipHandleVerification: true}
	relay := relaytesting.MustSimpleRelay(dir, t.TempDir(), false)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, srv.host, true, true))
	out := watchRelay(t, ctx, relay.Port)
	token, did := srv.account(t)
	first := srv.post(t, token, did, "before")
	require.Eventually(t, func() bool { return out.has("#commit " + first) }, time.Minute, 10*time.Millisecond)
	db, err := pgx.Connect(ctx, srv.dbURL)
	require.NoError(t, err)
	defer db.Close(ctx)
	var firstSeq int64
	require.NoError(t, db.QueryRow(ctx, "SELECT seq FROM events WHERE did = $1 AND rev = $2", did, first).Scan(&firstSeq))
	require.Eventually(t, func() bool {
		h, err := relay.Relay.GetHost(ctx, srv.host)
		return err == nil && h.LastSeq == firstSeq
	}, time.Minute, 20*time.Millisecond, "the relay saves its cursor")

	// The relay goes away; meanwhile a commit is stored oversized and
	// another follows it; the relay comes back at its cursor.
	require.NoError(t, relay.Relay.Slurper.KillUpstreamConnection(ctx, srv.host, false))
	bad := srv.post(t, token, did, "oversized once stored")
	later := srv.post(t, token, did, "after it")
	var badSeq int64
	require.Eventually(t, func() bool {
		return db.QueryRow(ctx, "SELECT seq FROM events WHERE did = $1 AND rev = $2 AND seq IS NOT NULL", did, bad).Scan(&badSeq) == nil
	}, time.Minute, 10*time.Millisecond)
	var body []byte
	require.NoError(t, db.QueryRow(ctx, "SELECT body FROM events WHERE seq = $1", badSeq).Scan(&body))
	body, seqOffset, blocksLen := eventlogtest.InflateCommit(t, body, 5_100_000)
	_, err = db.Exec(ctx, "UPDATE events SET body = $2, seq_offset = $3, blocks_len = $4 WHERE seq = $1", badSeq, body, seqOffset, blocksLen)
	require.NoError(t, err)
	// (SubscribeToHost does nothing while the old subscription winds down.)
	require.Eventually(t, func() bool { return !relay.Relay.Slurper.CheckIfSubscribed(srv.host) }, time.Minute, 10*time.Millisecond)
	require.NoError(t, relay.Relay.SubscribeToHost(ctx, srv.host, true, true))
	t.Cleanup(func() { _ = relay.Relay.Slurper.KillUpstreamConnection(context.Background(), srv.host, false) })

	// The incident, as it goes on.
	require.Eventually(t, func() bool { return relayLogs.count(`msg="host connection failed"`, "read limit exceeded") > 0 }, time.Minute, 10*time.Millisecond)
	logs0, cpu0, dials0 := srv.lines(), srv.cpu(t), relayLogs.count(`msg="host connection failed"`)+relayLogs.count(`msg="dialing failed"`)
	start := time.Now()
	time.Sleep(window) // the measurement window, not an ordering
	elapsed := time.Since(start)
	logs1, cpu1, dials1 := srv.lines(), srv.cpu(t), relayLogs.count(`msg="host connection failed"`)+relayLogs.count(`msg="dialing failed"`)
	refused := relayLogs.count(`msg="dialing failed"`)

	repaired := time.Now()
	srv.repair(t, badSeq)
	require.Eventually(t, func() bool { return out.has("#commit " + later) }, 5*time.Minute, 5*time.Millisecond, "the relay passes the event")
	recovery := time.Since(repaired)

	mode := "any client (default admission)"
	if allow {
		mode = "allow-listed (--firehose-allow 127.0.0.0/8)"
	}
	t.Logf("binary %s, %s, window %s:", bin, mode, elapsed.Round(time.Millisecond))
	t.Logf("  relay connections failed or refused: %d (%.1f/s), of them refused dials: %d", dials1-dials0, float64(dials1-dials0)/elapsed.Seconds(), refused)
	t.Logf("  server log lines: %d (%d WARN)", logs1.total-logs0.total, logs1.warn-logs0.warn)
	t.Logf("  CPU: bulwark %s, postgres %s, together %.3f of a core", (cpu1.bulwark - cpu0.bulwark).Round(time.Millisecond),
		(cpu1.postgres - cpu0.postgres).Round(time.Millisecond), float64(cpu1.bulwark-cpu0.bulwark+cpu1.postgres-cpu0.postgres)/float64(elapsed))
	t.Logf("  repair to the relay past the event: %s", recovery.Round(time.Millisecond))
}

// serveProcess is a `bulwark serve` child process.
type serveProcess struct {
	cmd      *exec.Cmd
	bin      string
	dataDir  string
	url      string
	host     string
	dbURL    string
	password string
	log      *syncbuf.Buffer
}

// startServeProcess starts bin serve on 127.0.0.1:port with a managed
// Postgres in a fresh data dir, the #sync fallback off.
func startServeProcess(t *testing.T, bin string, port int, allow bool) *serveProcess {
	t.Helper()
	root, err := os.MkdirTemp("", "relay-measure-")
	require.NoError(t, err)
	// Under root the managed Postgres runs as another user, which must
	// traverse every directory above its own.
	require.NoError(t, os.Chmod(root, 0o711))
	s := &serveProcess{bin: bin, dataDir: filepath.Join(root, "data"), host: fmt.Sprintf("localhost:%d", port), log: &syncbuf.Buffer{}}
	s.url = "http://" + s.host
	args := []string{"serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--hostname", s.host, "--data-dir", s.dataDir,
		"--log-format", "text", "--firehose-oversize-sync=false"}
	if allow {
		args = append(args, "--firehose-allow", "127.0.0.0/8")
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		_ = s.cmd.Wait()
		_ = os.RemoveAll(root)
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.url + "/xrpc/_health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 2*time.Minute, 50*time.Millisecond, "serve starts: %s", s.log)
	pw, err := os.ReadFile(filepath.Join(s.dataDir, "secrets", "admin-password"))
	require.NoError(t, err)
	s.password = strings.TrimSpace(string(pw))
	s.dbURL = (&url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/bulwark",
		RawQuery: url.Values{"host": {s.socketDir(t)}, "sslmode": {"disable"}}.Encode()}).String()
	return s
}

// socketDir is the managed Postgres's socket directory, as its log says.
func (s *serveProcess) socketDir(t *testing.T) string {
	for line := range strings.Lines(s.log.String()) {
		if _, rest, ok := strings.Cut(line, "socket_dir="); ok {
			return strings.Trim(strings.Fields(rest)[0], `"`)
		}
	}
	t.Fatalf("no socket_dir in the server's log: %s", s.log)
	return ""
}

// account creates an account with the admin CLI and logs in.
func (s *serveProcess) account(t *testing.T) (token, did string) {
	t.Helper()
	cmd := exec.Command(s.bin, "admin", "--url", s.url, "--data-dir", s.dataDir, "account", "create", "--handle", "measure", "--email", "measure@example.com", "--json")
	raw, err := cmd.Output()
	require.NoError(t, err, "%s", raw)
	var acct struct{ DID, Handle, Password string }
	require.NoError(t, json.Unmarshal(raw, &acct))
	var sess struct {
		AccessJwt string `json:"accessJwt"`
	}
	s.call(t, "com.atproto.server.createSession", "", map[string]string{"identifier": acct.Handle, "password": acct.Password}, &sess)
	return sess.AccessJwt, acct.DID
}

// post commits a note and returns its rev.
func (s *serveProcess) post(t *testing.T, token, did, text string) string {
	t.Helper()
	var out struct {
		Commit struct{ Rev string } `json:"commit"`
	}
	s.call(t, "com.atproto.repo.createRecord", "Bearer "+token, map[string]any{"repo": did, "collection": "app.bsky.feed.post",
		"record": map[string]any{"$type": "app.bsky.feed.post", "text": text, "createdAt": "2026-12-01T00:00:00Z"}}, &out)
	return out.Commit.Rev
}

// repair rewrites the event at seq as #sync through the admin XRPC method.
func (s *serveProcess) repair(t *testing.T, seq int64) {
	t.Helper()
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+s.password))
	s.call(t, "io.github.bulwark-pds.admin.rewriteEventAsSync", auth, map[string]any{"seq": seq, "reason": "measured incident"}, nil)
}

func (s *serveProcess) call(t *testing.T, nsid, auth string, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, s.url+"/xrpc/"+nsid, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", nsid, raw)
	if out != nil {
		require.NoError(t, json.Unmarshal(raw, out))
	}
}

// logCount is how many lines the server has logged.
type logCount struct{ total, warn int }

func (s *serveProcess) lines() logCount {
	var c logCount
	for line := range strings.Lines(s.log.String()) {
		c.total++
		if strings.Contains(line, "level=WARN") {
			c.warn++
		}
	}
	return c
}

// cpuUse is the CPU time used so far by the server and by its Postgres
// (the postmaster, its live children, and those it has reaped).
type cpuUse struct{ bulwark, postgres time.Duration }

func (s *serveProcess) cpu(t *testing.T) cpuUse {
	t.Helper()
	var u cpuUse
	st, err := procstat.Read(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	require.NoError(t, err)
	u.bulwark, err = st.CPU()
	require.NoError(t, err)
	pidFile, err := os.ReadFile(filepath.Join(s.dataDir, "postgres", "data", "postmaster.pid"))
	require.NoError(t, err)
	pm, _, _ := strings.Cut(string(pidFile), "\n")
	pm = strings.TrimSpace(pm)
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range ents {
		st, err := procstat.Read("/proc/" + e.Name() + "/stat")
		if err != nil || (e.Name() != pm && st.PPID() != pm) {
			continue
		}
		if cpu, err := st.CPU(); err == nil {
			u.postgres += cpu
		}
		if e.Name() == pm {
			// cutime and cstime (fields 16 and 17): children reaped.
			for _, f := range []int{16, 17} {
				v, _ := strconv.ParseInt(st[f-3], 10, 64)
				u.postgres += time.Duration(v) * (time.Second / procstat.ClockTicks)
			}
		}
	}
	return u
}
