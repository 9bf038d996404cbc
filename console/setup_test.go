package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/eventlog/eventlogtest"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/pds"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/relaywatch"
	"github.com/bulwark-pds/bulwark/repo"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const adminPassword = "console-test-admin-password"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is a running Bulwark (pds, firehose, accounts) with the console
// mounted at /admin/, on a real port.
type env struct {
	url      string // http://localhost:PORT
	host     string // localhost:PORT
	pool     *pgxpool.Pool
	log      *eventlog.Log
	seq      *eventlog.Sequencer
	hub      *firehose.Hub
	engine   *repo.Engine
	accounts *account.Service
	console  *console.Console
	// sampler is the overview's history (samples taken by hand).
	sampler *console.Sampler
	// budget is the in-flight budget, shown on the overview.
	budget *budget.Budget
	// seqs receives each last seq the sequencer assigns.
	seqs *seqWatch
}

type envOptions struct {
	// off serves no console.
	off bool
	// loginRules replace the consoleLogin policy.
	loginRules []ratelimit.Rule
	// globalRules replace the global policy.
	globalRules []ratelimit.Rule
	// watch, when set, is shown on the overview.
	watch func(e *env) *relaywatch.Watch
	// disableOversizeSync serves oversized events as stored.
	disableOversizeSync bool
	// passwordFile is where the login page says the password is.
	passwordFile string
	// smtp sends mail to a real SMTP server in the test (else mail is
	// held in the outbox).
	smtp bool
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pool := dbtest.New(t)
	e := &env{pool: pool, log: eventlog.NewLog(pool), seqs: &seqWatch{changed: make(chan struct{})}}
	e.seq = eventlog.NewSequencer(pool, eventlog.SequencerConfig{Logger: quiet})
	health := firehose.NewHealth(firehose.HealthConfig{Logger: quiet, Inspect: func(ctx context.Context, seq int64) (*eventlog.EventInfo, error) {
		evs, err := e.log.Inspect(ctx, eventlog.EventFilter{FromSeq: seq, Limit: 1})
		if err != nil || len(evs) == 0 {
			return nil, err
		}
		return &evs[0], nil
	}})
	e.hub = firehose.NewHub(pool, firehose.Config{Logger: quiet, Health: health, DisableOversizeSync: o.disableOversizeSync})
	e.seq.OnSequenced(e.hub.Notify)
	e.seq.OnSequenced(e.seqs.set)
	var wg sync.WaitGroup
	wg.Go(func() { _ = e.seq.Run(ctx) })
	wg.Go(func() { _ = e.hub.Run(ctx) })
	t.Cleanup(func() { cancel(); e.hub.Close(); wg.Wait() })

	plcSrv := httptest.NewServer(plctest.New())
	t.Cleanup(plcSrv.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e.host = fmt.Sprintf("localhost:%d", ln.Addr().(*net.TCPAddr).Port)
	e.url = "http://" + e.host
	rotation, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	cfg := config.DefaultConfig()
	cfg.DataDir, cfg.Hostname, cfg.PLCURL = t.TempDir(), e.host, plcSrv.URL
	cfg.HandleDomains = []string{".test"}
	cfg.JWTSecret, cfg.AdminPassword = strings.Repeat("j", 40), adminPassword
	cfg.PLCRotationKey = rotation.Multibase()
	require.NoError(t, cfg.Finalize())
	keys, err := account.NewKeyStore(pool, rotation.Bytes())
	require.NoError(t, err)
	e.engine = repo.New(pool, keys, e.seq, repo.Config{Logger: quiet})
	pc, err := plc.NewClient(cfg.PLCURL, rotation, nil)
	require.NoError(t, err)
	e.accounts, err = account.New(account.Config{
		Pool: pool, Keys: keys, Repo: e.engine, PLC: pc, Waker: e.seq, HandleDomains: cfg.HandleDomains,
		PublicURL: cfg.PublicURL(), ServiceDID: cfg.ServiceDID(), JWTSecret: []byte(cfg.JWTSecret),
		Password: account.PasswordParams{Memory: 256, Time: 1, Threads: 1}, Logger: quiet, Mail: newMailer(t, pool, o.smtp),
	})
	require.NoError(t, err)

	policies := ratelimit.DefaultPolicies()
	if o.loginRules != nil {
		policies[ratelimit.PolicyConsoleLogin] = o.loginRules
	}
	if o.globalRules != nil {
		policies[ratelimit.PolicyGlobal] = o.globalRules
	}
	limits, err := ratelimit.NewSet(policies, 0)
	require.NoError(t, err)
	opts := pds.Options{
		Config: cfg, DB: pool, Logger: quiet, Firehose: e.hub, Accounts: e.accounts, Repo: e.engine, Limits: limits,
		// The tests' consumers all come from loopback and redial at once.
		FirehoseAdmission: &firehose.AdmissionConfig{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, MaxPerClient: 64},
	}
	var srv *pds.Server
	if !o.off {
		e.budget = newBudget(cfg)
		opts.Budget = e.budget
		ccfg := console.Config{
			AdminPassword: adminPassword, SessionSecret: []byte(cfg.JWTSecret), Secure: !cfg.IsLocal(), Budget: e.budget,
			Log: e.log, Sync: repo.SyncEvent, DB: pool, Accounts: e.accounts, Health: health,
			LoginLimiter: limits.Get(ratelimit.PolicyConsoleLogin), Limiter: limits.Get(ratelimit.PolicyGlobal),
			Logger: quiet, AdminPasswordFile: o.passwordFile,
			ClientIP: func(r *http.Request) netip.Addr { return srv.ClientIP(r) },
		}
		if o.watch != nil {
			ccfg.Watch = o.watch(e)
		}
		e.sampler = console.NewSampler(console.SamplerConfig{Head: e.log.LastSeq, Gatherer: metrics.Registry, Logger: quiet})
		ccfg.Samples = e.sampler
		e.console, err = console.New(ccfg)
		require.NoError(t, err)
		opts.Console = e.console
	}
	srv, err = pds.New(opts)
	require.NoError(t, err)
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { e.hub.Close(); _ = hs.Close() })
	return e
}

// newMailer is a Mailer sending to a real SMTP server in the test when
// smtp is set; nil (mail held in the outbox) otherwise.
func newMailer(t *testing.T, pool *pgxpool.Pool, smtp bool) *email.Mailer {
	t.Helper()
	if !smtp {
		return nil
	}
	srv := emailtest.StartSMTP(t, emailtest.Options{})
	sc, err := email.ParseSMTPURL(srv.URL())
	require.NoError(t, err)
	m, err := email.New(pool, email.Config{From: "Bulwark <noreply@pds.test>", SMTP: sc, Logger: quiet})
	require.NoError(t, err)
	return m
}

// newBudget is the in-flight budget of cfg, as serve builds it.
func newBudget(cfg *config.Config) *budget.Budget {
	queue := cfg.InflightQueue
	if queue == 0 {
		queue = -1 // budget.Config: negative is "no queue"
	}
	return budget.New(budget.Config{Capacity: cfg.InflightBudget, MaxQueue: queue})
}

// seqWatch follows the last seq assigned.
type seqWatch struct {
	mu      sync.Mutex
	last    int64
	changed chan struct{}
}

func (w *seqWatch) set(last int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if last > w.last {
		w.last = last
		close(w.changed)
		w.changed = make(chan struct{})
	}
}

// wait returns the last seq once it is at least atLeast.
func (w *seqWatch) wait(t *testing.T, ctx context.Context, atLeast int64) int64 {
	t.Helper()
	for {
		w.mu.Lock()
		last, changed := w.last, w.changed
		w.mu.Unlock()
		if last >= atLeast {
			return last
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("the sequencer reached seq %d, not %d", last, atLeast)
		}
	}
}

// newRepo creates an account with a repository and two posts; it returns
// the DID and the seq of the last post's #commit.
func (e *env) newRepo(t *testing.T, handle string) (syntax.DID, int64) {
	t.Helper()
	ctx := context.Background()
	a, _, err := e.accounts.CreateAccount(ctx, account.CreateInput{Handle: handle, Email: strings.TrimSuffix(handle, ".test") + "@example.com", Password: "a password for " + handle})
	require.NoError(t, err)
	var res *repo.CommitResult
	for i := range 2 {
		res, err = e.engine.Apply(ctx, a.DID, []repo.Write{{
			Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
			Record: map[string]any{"$type": "app.bsky.feed.post", "text": fmt.Sprint("post ", i), "createdAt": "2026-11-29T00:00:00Z"},
		}}, nil)
		require.NoError(t, err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	var seq int64
	for seq == 0 {
		// The head before looking: an event sequenced after this read is
		// past it, so the wait below cannot miss it.
		last := e.lastSeq(t)
		evs, err := e.log.Inspect(ctx, eventlog.EventFilter{DID: a.DID.String(), Kind: eventlog.KindCommit, Limit: 10})
		require.NoError(t, err)
		for _, ev := range evs {
			if ev.Rev == res.Rev {
				seq = ev.Seq
			}
		}
		if seq == 0 {
			e.seqs.wait(t, wctx, last+1)
		}
	}
	return a.DID, seq
}

func (e *env) lastSeq(t *testing.T) int64 {
	t.Helper()
	last, err := e.log.LastSeq(context.Background())
	require.NoError(t, err)
	return last
}

// inflate rewrites the stored #commit at seq so that its blocks carry a
// filler block of n bytes after the real ones: a frame over what relays
// read, as a bug or an import could store.
func (e *env) inflate(t *testing.T, seq int64, n int) {
	t.Helper()
	ctx := context.Background()
	evs, err := e.log.After(ctx, seq-1, 1)
	require.NoError(t, err)
	require.Equal(t, seq, evs[0].Seq)
	ev := evs[0]
	body, seqOffset, blocksLen := eventlogtest.InflateCommit(t, ev.Body, n)
	_, err = e.pool.Exec(ctx, "UPDATE events SET body = $2, seq_offset = $3, blocks_len = $4 WHERE seq = $1", seq, body, seqOffset, blocksLen)
	require.NoError(t, err)
}

// browser is an HTTP client with a cookie jar, as a browser without
// JavaScript would use the console.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func (e *env) browser(t *testing.T) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: e.url, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// page is one answer.
type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) get(path string) page {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	require.NoError(b.t, err)
	return read(b.t, resp)
}

func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	resp, err := b.c.PostForm(b.base+path, form)
	require.NoError(b.t, err)
	return read(b.t, resp)
}

func read(t *testing.T, resp *http.Response) page {
	t.Helper()
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return page{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of the first form on p.
func (p page) csrf(t *testing.T) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(p.body)
	require.NotNil(t, m, "no form with a CSRF token in %s", p.body)
	return m[1]
}

// login logs in with password and returns the answer.
func (b *browser) login(password string) page {
	b.t.Helper()
	form := b.get(console.Prefix + "login")
	require.Equal(b.t, http.StatusOK, form.status)
	return b.post(console.Prefix+"login", url.Values{"csrf": {form.csrf(b.t)}, "password": {password}, "next": {console.Prefix}})
}

// mustLogin logs in and requires it to work.
func (b *browser) mustLogin() {
	b.t.Helper()
	p := b.login(adminPassword)
	require.Equal(b.t, http.StatusSeeOther, p.status, p.body)
	require.Equal(b.t, console.Prefix, p.header.Get("Location"))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
