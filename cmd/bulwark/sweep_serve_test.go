package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// TestServeSweepEveryMethod builds the binary and runs `bulwark serve` as
// the README's quick start does (default settings: the development PLC,
// the managed Postgres, the in-flight budget and the default rate limits;
// only the port and the data directory are chosen), creates an account
// with the admin CLI and an app password, then calls every XRPC method the
// server registers with no credentials, with bad ones (a garbage bearer
// token, a forged and an expired session JWT, HTTP Basic with a wrong
// password, DPoP junk) and with the app password's session, each with
// empty, junk and plausible input: never a 5xx, and every error a named
// XRPC error in the JSON shape. Each method and set of credentials comes
// from a loopback address of its own, so that the server's per-address
// limits (left at their defaults) do not turn the sweep into 429s.
func TestServeSweepEveryMethod(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the sweep of a running binary (builds it and runs a managed Postgres) in -short mode")
	}
	t.Parallel()
	methods := registeredMethods(t)
	bin := filepath.Join(t.TempDir(), "bulwark")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "go build")
	// Under root, Postgres runs as another user, which must be able to
	// traverse every directory above the cluster.
	root, err := os.MkdirTemp("", "bulwark-sweep-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(root, 0o711))
	dataDir := filepath.Join(root, "data")
	t.Cleanup(func() {
		stopOrphanedPostgres(t, dataDir)
		_ = os.RemoveAll(root)
	})
	port := freePort(t)
	lc := &lifecycle{t: t, bin: bin, base: fmt.Sprintf("http://127.0.0.1:%d", port), port: port, dataDir: dataDir,
		env: append(cleanEnv(), "BULWARK_DATA_DIR="+dataDir, "BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(port))}
	p := lc.start("serve")
	defer lc.stop("serve", p)

	sw := newServeSweep(t, lc)
	start := time.Now()
	inParallel(methods, 4, func(m sweptMethod) {
		for _, problem := range sw.method(m) {
			t.Error(problem)
		}
	})
	t.Logf("swept %d methods with %d requests in %v; answers: %s", len(methods), sw.count.Load(), time.Since(start).Round(time.Millisecond), sw.summary())
	for line := range strings.Lines(p.logs.String()) {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("logged as a failure: %.500s", line)
		}
	}
}

// sweptMethod is one registered XRPC method.
type sweptMethod struct {
	nsid      string
	procedure bool
}

// registeredMethods is the XRPC method table of a server built as serve
// builds it with the default settings (here on a test database).
func registeredMethods(t *testing.T) []sweptMethod {
	t.Helper()
	fs, cfg := settingsFlags("serve", io.Discard)
	_, ok := parseSettings(fs, cfg, []string{"--listen", "127.0.0.1:" + strconv.Itoa(freePort(t)), "--data-dir", t.TempDir()})
	require.True(t, ok)
	_, err := cfg.EnsureSecrets()
	require.NoError(t, err)
	srv, _, err := newServer(context.Background(), cfg, dbtest.New(t), nil, nil, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	var out []sweptMethod
	for _, r := range srv.Routes() {
		verb, path, _ := strings.Cut(r.Pattern, " ")
		if nsid, ok := strings.CutPrefix(path, "/xrpc/"); ok && nsid != "" {
			out = append(out, sweptMethod{nsid: nsid, procedure: verb == http.MethodPost})
		}
	}
	require.Greater(t, len(out), 70)
	return out
}

// serveSweep is the sweep's client state.
type serveSweep struct {
	t     *testing.T
	base  string
	lex   map[string]lexMethod
	acct  inputAccount
	modes []sweepMode
	count atomic.Int64

	mu      sync.Mutex
	answers map[string]int // "status error" -> count
}

// sweepMode is a set of credentials: the headers it adds.
type sweepMode struct {
	name string
	auth http.Header
	// full sends every input; otherwise only the empty and plausible
	// ones (a refused credential is refused whatever the input).
	full bool
}

// newServeSweep signs up the sweep's account with the admin CLI, signs in
// with an app password, and makes the credentials of every mode.
func newServeSweep(t *testing.T, lc *lifecycle) *serveSweep {
	code, out, errOut := cli("admin", "--url", lc.base, "--data-dir", lc.dataDir, "account", "create",
		"--handle", "sweeper", "--email", "sweeper@example.com", "--json")
	require.Equal(t, 0, code, errOut)
	var created createdAccount
	require.NoError(t, json.Unmarshal([]byte(out), &created))
	login := func(password string) map[string]any {
		return postOK(t, lc.base, "com.atproto.server.createSession", "", map[string]string{"identifier": created.Handle, "password": password})
	}
	full := login(created.Password)
	app := postOK(t, lc.base, "com.atproto.server.createAppPassword", full["accessJwt"].(string), map[string]string{"name": "sweep"})
	appSession := login(app["password"].(string))
	appAccess := appSession["accessJwt"].(string)

	secret, err := os.ReadFile(filepath.Join(lc.dataDir, config.SecretsDir, "jwt-secret"))
	require.NoError(t, err)
	domain := created.Handle[strings.Index(created.Handle, "."):]
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
	return &serveSweep{
		t: t, base: lc.base, lex: loadLexicons(t), answers: map[string]int{},
		acct: inputAccount{did: created.DID, handle: created.Handle, email: created.Email, password: "wrong-password", domain: domain},
		modes: []sweepMode{
			{name: "no credentials", full: true},
			{name: "app password", auth: bearer(appAccess), full: true},
			{name: "garbage bearer", auth: bearer("garbage")},
			{name: "forged JWT", auth: bearer(resign(t, appAccess, []byte("not the server's secret, but long enough"), time.Hour))},
			{name: "expired JWT", auth: bearer(resign(t, appAccess, bytes.TrimSpace(secret), -time.Hour))},
			{name: "wrong admin password", auth: http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("admin:wrong"))}}},
			{name: "DPoP junk", auth: http.Header{"Authorization": {"DPoP " + appAccess}, "Dpop": {"junk.junk.junk"}}},
		},
	}
}

// resign is token with its expiry moved to now+exp, signed with secret.
func resign(t *testing.T, token string, secret []byte, exp time.Duration) string {
	t.Helper()
	claims := jwt.MapClaims{}
	parsed, _, err := jwt.NewParser().ParseUnverified(token, claims)
	require.NoError(t, err)
	claims["exp"] = time.Now().Add(exp).Unix()
	claims["iat"] = time.Now().Add(exp - time.Hour).Unix()
	out := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	out.Header["typ"] = parsed.Header["typ"]
	s, err := out.SignedString(secret)
	require.NoError(t, err)
	return s
}

// method sweeps one method in every mode, each from an address of its
// own, and returns what was wrong with the answers.
func (sw *serveSweep) method(m sweptMethod) []string {
	lm, ok := sw.lex[m.nsid]
	if !ok {
		lm = genericMethod
	}
	plausible := plausibleInputs(lm, m.procedure, sw.acct)
	junk := junkInputs(lm, m.procedure)
	var problems []string
	for _, mode := range sw.modes {
		inputs := append([]xrpcInput{junk[0]}, plausible...)
		if mode.full {
			inputs = append(inputs, junk[1:]...)
		}
		client := newSourceClient()
		for _, in := range inputs {
			if p := sw.send(client, m, mode, in); p != "" {
				problems = append(problems, p)
			}
		}
		client.CloseIdleConnections()
	}
	return problems
}

// send makes one call and judges its answer: "" when it is fine.
func (sw *serveSweep) send(client *http.Client, m sweptMethod, mode sweepMode, in xrpcInput) string {
	what := fmt.Sprintf("%s [%s] %s", m.nsid, mode.name, in.name)
	req, err := in.newRequest(sw.base, m.nsid, m.procedure)
	if err != nil {
		return what + ": " + err.Error()
	}
	for k, v := range mode.auth {
		req.Header[k] = v
	}
	sw.count.Add(1)
	resp, err := client.Do(req)
	if err != nil {
		return what + ": " + err.Error()
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Sprintf("%s: status %d, body cut off: %v", what, resp.StatusCode, err)
	}
	var e struct {
		Error   *string `json:"error"`
		Message *string `json:"message"`
	}
	named := json.Unmarshal(body, &e) == nil && e.Error != nil && *e.Error != "" && e.Message != nil && *e.Message != ""
	sw.mu.Lock()
	key := strconv.Itoa(resp.StatusCode)
	if e.Error != nil {
		key += " " + *e.Error
	}
	sw.answers[key]++
	sw.mu.Unlock()
	switch status := resp.StatusCode; {
	case status == http.StatusNotImplemented && named && *e.Error == "MethodNotImplemented":
		return ""
	case status >= 500:
		return fmt.Sprintf("%s: status %d: %.300s", what, status, body)
	case status >= 300 && status < 400:
		return fmt.Sprintf("%s: redirect %d", what, status)
	case status >= 400 && !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"):
		return fmt.Sprintf("%s: status %d as %q: %.300s", what, status, resp.Header.Get("Content-Type"), body)
	case status >= 400 && !named:
		return fmt.Sprintf("%s: status %d without an error name and message: %.300s", what, status, body)
	}
	return ""
}

// summary is the answers by status and error name.
func (sw *serveSweep) summary() string {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	keys := make([]string, 0, len(sw.answers))
	for k := range sw.answers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, sw.answers[k]))
	}
	return strings.Join(parts, ", ")
}
