package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/repo"
)

// testPasswordParams keep argon2id cheap in tests (the race detector makes
// the real cost seconds); production uses account.DefaultPasswordParams.
var testPasswordParams = account.PasswordParams{Memory: 256, Time: 1, Threads: 1}

const testAdminPassword = "admin-secret-for-tests"

// accountEnv is a running Bulwark with accounts, a repo engine and a local
// PLC directory.
type accountEnv struct {
	url      string
	cfg      *config.Config
	pool     *pgxpool.Pool
	plc      *plctest.Directory
	plcURL   string
	accounts *account.Service
	engine   *repo.Engine
	blobs    *blob.Service // nil unless envOptions.blobs
	keys     *account.KeyStore
	jwt      []byte
	// server is the running Server (its method table, for sweeps).
	server *Server
}

type envOptions struct {
	configure func(*config.Config)
	// plcHandler replaces the PLC directory (to make it fail).
	plcHandler http.Handler
	// pool replaces the fresh test database (benchmarks: a durable one).
	pool *pgxpool.Pool
	// sequence runs a firehose sequencer woken by commits, as in serve.
	sequence bool
	// options adjusts the server's Options (rate limits, budget).
	options func(*Options)
	// cleaners are passed to account.Config.Cleaners.
	cleaners []account.Cleaner
	// mail, when set, configures the accounts' Mailer (default: one
	// without SMTP, which holds every mail).
	mail *email.Config
	// logs, when set, receives every log line at debug level.
	logs *lockedBuffer
	// blobs wires a blob service on disk, as serve does: the engine
	// tracks blob references, account deletion cleans them up.
	blobs bool
	// sessionEnders are passed to account.Config.SessionEnders.
	sessionEnders []account.SessionEnder
	// passwordHashes, passwordSlots, passwordWait and passwordParams, when
	// set, replace the test defaults (64 cheap hashes at once).
	passwordHashes int
	passwordSlots  *budget.Budget
	passwordWait   time.Duration
	passwordParams *account.PasswordParams
}

func newAccountEnv(t testing.TB, opts envOptions) *accountEnv {
	t.Helper()
	dir := plctest.New()
	var plcSrv *httptest.Server
	if opts.plcHandler != nil {
		plcSrv = httptest.NewServer(opts.plcHandler)
	} else {
		plcSrv = httptest.NewServer(dir)
	}
	t.Cleanup(plcSrv.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port

	rotation, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	cfg := config.DefaultConfig()
	cfg.DataDir = t.(interface{ TempDir() string }).TempDir()
	cfg.Hostname = "localhost:" + itoa(port)
	cfg.HandleDomains = []string{".test"}
	cfg.PLCURL = plcSrv.URL
	cfg.PLCRotationKey = rotation.Multibase()
	cfg.JWTSecret = strings.Repeat("j", 40)
	cfg.AdminPassword = testAdminPassword
	if opts.configure != nil {
		opts.configure(cfg)
	}
	require.NoError(t, cfg.Finalize())

	pool := opts.pool
	if pool == nil {
		pool = dbtest.New(t)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if opts.logs != nil {
		logger = slog.New(slog.NewTextHandler(opts.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	var mailer *email.Mailer
	if opts.mail != nil {
		mc := *opts.mail
		mc.Hostname, mc.Logger = cfg.Hostname, logger
		mailer, err = email.New(pool, mc)
		require.NoError(t, err)
	}
	keys, err := account.NewKeyStore(pool, rotation.Bytes())
	require.NoError(t, err)
	var waker repo.Waker
	if opts.sequence {
		seq := eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: logger})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = seq.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		waker = seq
	}
	var blobs *blob.Service
	rcfg := repo.Config{Logger: logger}
	if opts.blobs {
		store, err := blob.NewDiskStore(cfg.BlobDir)
		require.NoError(t, err)
		blobs = blob.New(pool, store, blob.Config{MaxBytes: cfg.BlobMaxBytes, TempTTL: cfg.BlobTempTTL, Logger: logger})
		rcfg.Blobs = blobs
		opts.cleaners = append(opts.cleaners, blobs)
	}
	engine := repo.New(pool, keys, waker, rcfg)
	pc, err := plc.NewClient(cfg.PLCURL, rotation, nil)
	require.NoError(t, err)
	// Test hashes are cheap, and sweeps log in concurrently.
	hashes, params := 64, testPasswordParams
	if opts.passwordHashes != 0 {
		hashes = opts.passwordHashes
	}
	if opts.passwordParams != nil {
		params = *opts.passwordParams
	}
	accts, err := account.New(account.Config{
		Pool: pool, Keys: keys, Repo: engine, PLC: pc, Waker: waker,
		HandleDomains: cfg.HandleDomains, InviteRequired: cfg.InviteRequired,
		PublicURL: cfg.PublicURL(), ServiceDID: cfg.ServiceDID(), JWTSecret: []byte(cfg.JWTSecret),
		Password: params, Logger: logger, Cleaners: opts.cleaners, Mail: mailer, SessionEnders: opts.sessionEnders,
		PasswordHashes: hashes, PasswordSlots: opts.passwordSlots, PasswordWait: opts.passwordWait,
	})
	require.NoError(t, err)
	o := Options{Config: cfg, DB: pool, Logger: logger, Version: "test", Accounts: accts, Repo: engine, Blobs: blobs, Keys: keys}
	if opts.options != nil {
		opts.options(&o)
	}
	s, err := New(o)
	require.NoError(t, err)
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.Listener.Close()
	ts.Listener = ln
	ts.Start()
	t.Cleanup(ts.Close)
	return &accountEnv{
		url: ts.URL, cfg: cfg, pool: pool, plc: dir, plcURL: plcSrv.URL,
		accounts: accts, engine: engine, blobs: blobs, keys: keys, jwt: []byte(cfg.JWTSecret), server: s,
	}
}

// xrpcResult is a response with its body.
type xrpcResult struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a map.
func (r xrpcResult) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

// str returns a top-level string field.
func (r xrpcResult) str(t testing.TB, field string) string {
	t.Helper()
	v, _ := r.json(t)[field].(string)
	return v
}

// ok requires a 200.
func (r xrpcResult) ok(t testing.TB) xrpcResult {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	return r
}

// fails requires an XRPC error with status and name.
func (r xrpcResult) fails(t testing.TB, status int, name string) string {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	var e xrpcErrorBody
	require.NoError(t, json.Unmarshal(r.body, &e), "body: %s", r.body)
	require.Equal(t, name, e.Error, "body: %s", r.body)
	require.NotEmpty(t, e.Message)
	return e.Message
}

func (e *accountEnv) do(t testing.TB, method, nsid, token string, body io.Reader, q url.Values, header http.Header) xrpcResult {
	t.Helper()
	u := e.url + "/xrpc/" + nsid
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return xrpcResult{status: resp.StatusCode, header: resp.Header, body: b}
}

func (e *accountEnv) post(t testing.TB, nsid, token string, in any) xrpcResult {
	t.Helper()
	var body io.Reader = http.NoBody
	switch v := in.(type) {
	case nil:
	case []byte:
		body = bytes.NewReader(v)
	default:
		b, err := json.Marshal(in)
		require.NoError(t, err)
		body = bytes.NewReader(b)
	}
	return e.do(t, http.MethodPost, nsid, token, body, nil, nil)
}

func (e *accountEnv) get(t testing.TB, nsid, token string, q url.Values) xrpcResult {
	t.Helper()
	return e.do(t, http.MethodGet, nsid, token, nil, q, nil)
}

// user is a created account with its session.
type user struct {
	did     syntax.DID
	handle  string
	pass    string
	access  string
	refresh string
}

var userSeq atomic.Int64

// createUser creates an account with a unique handle.
func (e *accountEnv) createUser(t testing.TB) *user {
	t.Helper()
	n := userSeq.Add(1)
	u := &user{handle: "user" + itoa(int(n)) + ".test", pass: "correct horse battery"}
	res := e.post(t, "com.atproto.server.createAccount", "", map[string]any{
		"handle": u.handle, "email": "user" + itoa(int(n)) + "@example.com", "password": u.pass,
	}).ok(t)
	u.did = syntax.DID(res.str(t, "did"))
	u.access, u.refresh = res.str(t, "accessJwt"), res.str(t, "refreshJwt")
	require.NotEmpty(t, u.access)
	return u
}

// rowCounts counts rows in the tables an account or a write touches.
func (e *accountEnv) rowCounts(t testing.TB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"accounts", "repo_roots", "repo_nodes", "records", "events", "refresh_tokens", "app_passwords", "invite_code_uses"} {
		var n int
		require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
		out[table] = n
	}
	var revs string
	require.NoError(t, e.pool.QueryRow(context.Background(), "SELECT coalesce(string_agg(rev, ',' ORDER BY did), '') FROM repo_roots").Scan(&revs))
	out["revs:"+revs] = 1
	return out
}

// eventKinds lists did's events, oldest first, as kind strings.
func (e *accountEnv) eventKinds(t testing.TB, did syntax.DID) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT kind FROM events WHERE did = $1 ORDER BY id", did.String())
	require.NoError(t, err)
	var kinds []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		kinds = append(kinds, k)
	}
	require.NoError(t, rows.Err())
	return kinds
}
