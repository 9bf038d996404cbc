package relaytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/cmd/relay/stream"
	"github.com/bluesky-social/indigo/cmd/relay/stream/schedulers/sequential"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/repo"
)

// moveAdminPassword is the administrator password of the servers an
// account moves between.
const moveAdminPassword = "move-test-admin-password"

// bulwark is a whole Bulwark server (accounts, repositories, firehose)
// served on localhost:PORT, as `bulwark serve` wires it, with its mail
// held for the operator.
type bulwark struct {
	host string // localhost:PORT, what the relay dials and DID documents name
	url  string
	hub  *firehose.Hub
}

// startPLC serves one verifying PLC directory for the servers of a test.
func startPLC(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(plctest.New())
	t.Cleanup(srv.Close)
	return srv.URL
}

// startBulwark starts a server whose DIDs live in the PLC directory at
// plcURL; it stops when the test ends.
func startBulwark(t *testing.T, plcURL string) *bulwark {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rotation, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	cfg := config.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Hostname = fmt.Sprintf("localhost:%d", ln.Addr().(*net.TCPAddr).Port)
	cfg.HandleDomains = []string{".test"}
	cfg.PLCURL = plcURL
	cfg.PLCRotationKey = rotation.Multibase()
	cfg.JWTSecret = strings.Repeat("s", 40)
	cfg.AdminPassword = moveAdminPassword
	require.NoError(t, cfg.Finalize())

	pool := dbtest.New(t)
	keys, err := account.NewKeyStore(pool, rotation.Bytes())
	require.NoError(t, err)
	seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: quiet})
	hub := firehose.NewHub(pool, firehose.Config{Logger: quiet})
	seq.OnSequenced(hub.Notify)
	wg.Go(func() { _ = seq.Run(ctx) })
	wg.Go(func() { _ = hub.Run(ctx) })
	engine := repo.New(pool, keys, seq, repo.Config{Logger: quiet})
	pc, err := plc.NewClient(cfg.PLCURL, rotation, nil)
	require.NoError(t, err)
	accts, err := account.New(account.Config{
		Pool: pool, Keys: keys, Repo: engine, PLC: pc, Waker: seq,
		HandleDomains: cfg.HandleDomains, PublicURL: cfg.PublicURL(), ServiceDID: cfg.ServiceDID(),
		JWTSecret: []byte(cfg.JWTSecret), Password: account.PasswordParams{Memory: 256, Time: 1, Threads: 1}, Logger: quiet,
	})
	require.NoError(t, err)
	srv, err := pds.New(pds.Options{Config: cfg, DB: pool, Logger: quiet, Version: "test", Accounts: accts, Repo: engine, Keys: keys, Firehose: hub})
	require.NoError(t, err)
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hub.Close(); _ = hs.Close(); cancel(); wg.Wait() })
	return &bulwark{host: cfg.Hostname, url: cfg.PublicURL(), hub: hub}
}

// login signs in to b.
func (b *bulwark) login(t *testing.T, ident, password string) *atclient.APIClient {
	t.Helper()
	c, err := atclient.LoginWithPasswordHost(context.Background(), b.url, ident, password, "", nil)
	require.NoError(t, err)
	return c
}

// mailedPLCCode asks b to mail did's holder a PLC operation code, and
// reads it as the operator reads held mail (getPendingEmailTokens).
func (b *bulwark) mailedPLCCode(t *testing.T, c *atclient.APIClient, did syntax.DID) string {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, comatproto.IdentityRequestPlcOperationSignature(ctx, c))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/xrpc/"+pds.AdminNSIDPrefix+"getPendingEmailTokens?account="+did.String(), nil)
	require.NoError(t, err)
	req.SetBasicAuth("admin", moveAdminPassword)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var out struct {
		Tokens []struct{ Purpose, Code string }
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	for _, tok := range out.Tokens {
		if tok.Purpose == "plc_operation" {
			return tok.Code
		}
	}
	t.Fatalf("no PLC operation code held for %s", did)
	return ""
}

// moveData is the first half of goat's `account migrate`: the account
// created on the new server with a service-auth token of the old, a
// session there, the repository and the preferences copied. It returns
// the client of the new account (deactivated until activateAccount).
func moveData(ctx context.Context, old *atclient.APIClient, newURL, handle, password string) (*atclient.APIClient, error) {
	did := *old.AccountDID
	nc := atclient.NewAPIClient(newURL)
	desc, err := comatproto.ServerDescribeServer(ctx, nc)
	if err != nil {
		return nil, fmt.Errorf("describeServer: %w", err)
	}
	auth, err := comatproto.ServerGetServiceAuth(ctx, old, desc.Did, time.Now().Add(time.Minute).Unix(), "com.atproto.server.createAccount")
	if err != nil {
		return nil, fmt.Errorf("getServiceAuth: %w", err)
	}
	didStr, email := did.String(), "moved-"+handle+"@example.com"
	nc.AccountDID = &did
	nc.Auth = &atclient.PasswordAuth{Session: atclient.PasswordSessionData{AccountDID: did, AccessToken: auth.Token}}
	if _, err := comatproto.ServerCreateAccount(ctx, nc, &comatproto.ServerCreateAccount_Input{Did: &didStr, Handle: handle, Password: &password, Email: &email}); err != nil {
		return nil, fmt.Errorf("createAccount: %w", err)
	}
	nc, err = atclient.LoginWithPasswordHost(ctx, newURL, didStr, password, "", nil)
	if err != nil {
		return nil, fmt.Errorf("createSession: %w", err)
	}
	car, err := comatproto.SyncGetRepo(ctx, old, didStr, "")
	if err != nil {
		return nil, fmt.Errorf("getRepo: %w", err)
	}
	if err := comatproto.RepoImportRepo(ctx, nc, bytes.NewReader(car)); err != nil {
		return nil, fmt.Errorf("importRepo: %w", err)
	}
	prefs, err := agnostic.ActorGetPreferences(ctx, old)
	if err != nil {
		return nil, fmt.Errorf("getPreferences: %w", err)
	}
	if err := agnostic.ActorPutPreferences(ctx, nc, &agnostic.ActorPutPreferences_Input{Preferences: prefs.Preferences}); err != nil {
		return nil, fmt.Errorf("putPreferences: %w", err)
	}
	return nc, nil
}

// moveIdentity is goat's identity step: the new server's recommended
// credentials, signed by the old server with the mailed code, submitted
// to the new one.
func moveIdentity(ctx context.Context, old, nc *atclient.APIClient, token string) error {
	creds, err := agnostic.IdentityGetRecommendedDidCredentials(ctx, nc)
	if err != nil {
		return fmt.Errorf("getRecommendedDidCredentials: %w", err)
	}
	var op agnostic.IdentitySignPlcOperation_Input
	if err := json.Unmarshal(*creds, &op); err != nil {
		return fmt.Errorf("recommended credentials: %w", err)
	}
	op.Token = &token
	signed, err := agnostic.IdentitySignPlcOperation(ctx, old, &op)
	if err != nil {
		return fmt.Errorf("signPlcOperation: %w", err)
	}
	if err := agnostic.IdentitySubmitPlcOperation(ctx, nc, &agnostic.IdentitySubmitPlcOperation_Input{Operation: signed.Operation}); err != nil {
		return fmt.Errorf("submitPlcOperation: %w", err)
	}
	return nil
}

// watchRelayEvents reads everything indigo's relay re-emits, with its
// stream package, until the test ends.
func watchRelayEvents(t *testing.T, port int) *relayedEvents {
	t.Helper()
	out := &relayedEvents{}
	cb := &stream.RepoStreamCallbacks{
		RepoCommit: func(ev *comatproto.SyncSubscribeRepos_Commit) error {
			return out.keep(&stream.XRPCStreamEvent{RepoCommit: ev})
		},
		RepoSync: func(ev *comatproto.SyncSubscribeRepos_Sync) error {
			return out.keep(&stream.XRPCStreamEvent{RepoSync: ev})
		},
		RepoIdentity: func(ev *comatproto.SyncSubscribeRepos_Identity) error {
			return out.keep(&stream.XRPCStreamEvent{RepoIdentity: ev})
		},
		RepoAccount: func(ev *comatproto.SyncSubscribeRepos_Account) error {
			return out.keep(&stream.XRPCStreamEvent{RepoAccount: ev})
		},
	}
	conn, _, err := websocket.DefaultDialer.Dial(fmt.Sprintf("ws://localhost:%d/xrpc/com.atproto.sync.subscribeRepos", port), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = stream.HandleRepoStream(ctx, conn, sequential.NewScheduler("relaytest-move", cb.EventHandler), quiet)
	}()
	t.Cleanup(func() { cancel(); _ = conn.Close(); <-done })
	return out
}
