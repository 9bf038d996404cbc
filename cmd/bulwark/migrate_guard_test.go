package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// guardResult is one answer of the server under test.
type guardResult struct {
	status int
	body   map[string]any
	raw    string
}

// guardPost posts body (JSON unless contentType says otherwise) to base's
// nsid as token.
func guardPost(t *testing.T, base, nsid, token, contentType string, body io.Reader) guardResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/xrpc/"+nsid, body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", contentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := guardResult{status: resp.StatusCode, raw: string(b)}
	_ = json.Unmarshal(b, &r.body)
	return r
}

func guardJSON(t *testing.T, base, nsid, token string, in any) guardResult {
	t.Helper()
	b, err := json.Marshal(in)
	require.NoError(t, err)
	return guardPost(t, base, nsid, token, "application/json", bytes.NewReader(b))
}

// TestServeMigrationGuards runs serve with its default settings (a test
// PLC directory and mail server aside) and checks, from outside, the
// guards around moving accounts: a replayed migration token gets 401
// JwtReplayed and the account it created still logs in; another
// account's import succeeds while one account runs two slow imports; and
// code requests flooding one address stop at its mail limit.
//
// Not parallel: serve registers its limiters with the process-wide
// metrics registry.
func TestServeMigrationGuards(t *testing.T) {
	sink := emailtest.StartSMTP(t, emailtest.Options{})
	dir := plctest.New()
	plcSrv := httptest.NewServer(dir)
	t.Cleanup(plcSrv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dbURL := dbtest.NewURL(t)
	args := []string{"serve", "--database-url", dbURL, "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--plc-url", plcSrv.URL, "--handle-domains", ".test", "--smtp-url", sink.URL(), "--email-from", "Bulwark <noreply@pds.test>"}
	addr, done, logs := startServe(t, ctx, args)
	base := "http://" + addr

	guardReplay(t, base, plcSrv.URL)
	guardSlowImports(t, base, dbURL)
	guardMailFlood(t, base, sink)

	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
}

// guardReplay brings a DID hosted elsewhere here with a service-auth JWT
// it signed, then replays the JWT with another handle and password.
func guardReplay(t *testing.T, base, plcURL string) {
	t.Helper()
	d, ok := describe(base)
	require.True(t, ok)
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	pub, err := key.PublicKey()
	require.NoError(t, err)
	rot, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	c, err := plc.NewClient(plcURL, rot, nil)
	require.NoError(t, err)
	did, op, err := c.Genesis(plc.Identity{Handle: "mover.test", SigningKey: pub, PDSEndpoint: "https://old.example.com"})
	require.NoError(t, err)
	require.NoError(t, c.Submit(context.Background(), did, op))
	lxm := syntax.NSID("com.atproto.server.createAccount")
	token, err := auth.SignServiceAuth(did, d.DID, time.Minute, &lxm, key)
	require.NoError(t, err)

	in := map[string]any{"did": did, "handle": "mover.test", "email": "mover@example.com", "password": "mover's password"}
	require.Equal(t, http.StatusOK, guardJSON(t, base, "com.atproto.server.createAccount", token, in).status)
	in = map[string]any{"did": did, "handle": "mallory.test", "email": "mallory@example.com", "password": "mallory's password"}
	replay := guardJSON(t, base, "com.atproto.server.createAccount", token, in)
	require.Equal(t, http.StatusUnauthorized, replay.status, replay.raw)
	require.Equal(t, "JwtReplayed", replay.body["error"])
	login := guardJSON(t, base, "com.atproto.server.createSession", "", map[string]any{"identifier": "mover.test", "password": "mover's password"})
	require.Equal(t, http.StatusOK, login.status, login.raw)
	require.Equal(t, did.String(), login.body["did"])
}

// guardSlowImports holds one import of mallory's open, sees her second
// refused at once, and imports bob's repository meanwhile.
func guardSlowImports(t *testing.T, base, dbURL string) {
	t.Helper()
	account := func(name string) (syntax.DID, string, []byte) {
		res := guardJSON(t, base, "com.atproto.server.createAccount", "", map[string]any{"handle": name + ".test", "email": name + "@example.com", "password": name + " password"})
		require.Equal(t, http.StatusOK, res.status, res.raw)
		did := syntax.DID(res.body["did"].(string))
		resp, err := http.Get(base + "/xrpc/com.atproto.sync.getRepo?did=" + did.String())
		require.NoError(t, err)
		car, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		return did, res.body["accessJwt"].(string), car
	}
	_, mallory, malloryCAR := account("mallory")
	_, bob, bobCAR := account("bob")
	const car = "application/vnd.ipld.car"

	// A first import whose body stops after its first bytes: it holds
	// its slot until the body is abandoned. Once it holds the slot (its
	// staging table exists: the server creates it after taking the slot),
	// a second import of the same account is refused at once.
	pr, pw := io.Pipe()
	first := make(chan int, 1)
	go func() { first <- heldImportStatus(base, mallory, pr) }()
	go func() { _, _ = pw.Write(malloryCAR[:len(malloryCAR)/2]) }()
	waitForStaging(t, dbURL, first)
	second := guardPost(t, base, "com.atproto.repo.importRepo", mallory, car, bytes.NewReader(malloryCAR))
	require.Equal(t, http.StatusTooManyRequests, second.status, second.raw)
	require.Equal(t, "RateLimitExceeded", second.body["error"])
	require.Contains(t, second.raw, "already running")

	res := guardPost(t, base, "com.atproto.repo.importRepo", bob, car, bytes.NewReader(bobCAR))
	require.Equal(t, http.StatusOK, res.status, "bob's import while mallory's is held: %s", res.raw)
	select {
	case status := <-first:
		t.Fatalf("mallory's held import was answered (%d)", status)
	default:
	}
	pw.CloseWithError(io.ErrUnexpectedEOF)
	<-first
}

// waitForStaging waits until an import's staging table exists in dbURL's
// database (the import holds its slot), or fails if the import ended.
func waitForStaging(t *testing.T, dbURL string, ended <-chan int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	limit := time.After(waitLimit)
	for {
		var n int
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'import_blocks' AND relpersistence = 't'").Scan(&n))
		if n > 0 {
			return
		}
		select {
		case status := <-ended:
			t.Fatalf("the held import was answered (%d) before it staged anything", status)
		case <-limit:
			t.Fatal("the held import never staged anything")
		case <-tick.C:
		}
	}
}

// heldImportStatus posts an importRepo with body and returns its status,
// or -1 when the request fails (the test abandons the body).
func heldImportStatus(base, token string, body io.Reader) int {
	req, err := http.NewRequest(http.MethodPost, base+"/xrpc/com.atproto.repo.importRepo", body)
	if err != nil {
		return -1
	}
	req.Header.Set("Content-Type", "application/vnd.ipld.car")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	resp.Body.Close()
	return resp.StatusCode
}

// guardMailFlood asks for confirmation codes to one address until its
// limit refuses them, and counts what reached the mail server.
func guardMailFlood(t *testing.T, base string, sink *emailtest.Server) {
	t.Helper()
	res := guardJSON(t, base, "com.atproto.server.createAccount", "", map[string]any{"handle": "flood.test", "email": "victim@example.com", "password": "flood password"})
	require.Equal(t, http.StatusOK, res.status, res.raw)
	token := res.body["accessJwt"].(string)
	// The account's own limit on confirmation requests is as high as the
	// address's, so the last request is of another kind.
	n := ratelimit.DefaultPolicies()[ratelimit.PolicyMailRecipient][0].Limit
	for i := range n {
		require.Equal(t, http.StatusOK, guardJSON(t, base, "com.atproto.server.requestEmailConfirmation", token, nil).status)
		select {
		case m := <-sink.Mails():
			require.Equal(t, []string{"victim@example.com"}, m.To)
		case <-time.After(waitLimit):
			t.Fatalf("mail %d never arrived", i+1)
		}
	}
	refused := guardJSON(t, base, "com.atproto.server.requestAccountDelete", token, nil)
	require.Equal(t, http.StatusTooManyRequests, refused.status, refused.raw)
	require.Contains(t, refused.raw, "mailRecipient")
}
