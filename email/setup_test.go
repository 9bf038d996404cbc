package email_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/internal/syncbuf"
	"github.com/bulwark-pds/bulwark/internal/testclock"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const (
	smtpUser = "bulwark"
	// smtpPass is the SMTP password every test uses; no log line may
	// contain it.
	smtpPass = "s3cret-Pa55word-never-logged"
)

// startSMTP starts a test SMTP server that wants the tests' login.
func startSMTP(t testing.TB, o emailtest.Options) *emailtest.Server {
	t.Helper()
	o.User, o.Password = smtpUser, smtpPass
	return emailtest.StartSMTP(t, o)
}

// env is one test's database, clock, logs and metrics.
type env struct {
	pool  *pgxpool.Pool
	clock *testclock.Clock
	logs  *syncbuf.Buffer
	reg   *prometheus.Registry
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return &env{pool: dbtest.New(t), clock: testclock.New(time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)), logs: &syncbuf.Buffer{}, reg: prometheus.NewRegistry()}
}

// config is a Config for this env; smtpURL "" means no SMTP.
func (e *env) config(t testing.TB, smtpURL string) email.Config {
	t.Helper()
	cfg := email.Config{
		From:        "Bulwark <noreply@pds.test>",
		Hostname:    "pds.test",
		Now:         e.clock.Now,
		Logger:      slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SendTimeout: 10 * time.Second,
	}
	if smtpURL != "" {
		c, err := email.ParseSMTPURL(smtpURL)
		require.NoError(t, err)
		cfg.SMTP = c
	}
	return cfg
}

// mailer builds a Mailer (registering its metrics with e.reg).
func (e *env) mailer(t testing.TB, cfg email.Config) *email.Mailer {
	t.Helper()
	cfg.Registerer = e.reg
	m, err := email.New(e.pool, cfg)
	require.NoError(t, err)
	return m
}

// plainURL is the URL of a plain-text loopback server with the test login.
func plainURL(addr string) string {
	return fmt.Sprintf("smtp://%s:%s@%s?tls=none", smtpUser, smtpPass, addr)
}

var accountSeq atomic.Int64

// account inserts an account row and returns its DID.
func (e *env) account(t testing.TB) syntax.DID {
	t.Helper()
	n := accountSeq.Add(1)
	did := syntax.DID(fmt.Sprintf("did:plc:mail%020d", n))
	_, err := e.pool.Exec(context.Background(),
		`INSERT INTO accounts (did, handle, email, password_hash, signing_key) VALUES ($1, $2, $3, 'x', '\x00')`,
		did.String(), fmt.Sprintf("user%d.pds.test", n), fmt.Sprintf("user%d@example.com", n))
	require.NoError(t, err)
	return did
}

// sendToken runs SendToken in a transaction of its own and commits it.
func (e *env) sendToken(t testing.TB, m *email.Mailer, did syntax.DID, purpose email.Purpose) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, m.SendToken(ctx, tx, did, "owner@example.com", purpose, email.TokenData{Handle: "alice.pds.test"}))
	require.NoError(t, tx.Commit(ctx))
}

// consume runs Consume in a transaction, committed on success.
func (e *env) consume(t testing.TB, m *email.Mailer, did syntax.DID, purpose email.Purpose, code string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if err := m.Consume(ctx, tx, did, purpose, code); err != nil {
		return err
	}
	require.NoError(t, tx.Commit(ctx))
	return nil
}

// state returns the outbox states in id order.
func (e *env) states(t testing.TB) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT state FROM email_outbox ORDER BY id`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

func mustContainNone(t testing.TB, haystack string, needles ...string) {
	t.Helper()
	for _, n := range needles {
		require.False(t, strings.Contains(haystack, n), "found %q", n)
	}
}
