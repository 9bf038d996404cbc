package email_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
)

// row is the delivery state of one outbox row.
type row struct {
	State    string
	Attempts int
	Next     time.Time
	Note     string
}

func (e *env) row(t testing.TB, id int64) row {
	t.Helper()
	var r row
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT state, attempts, next_attempt_at, note FROM email_outbox WHERE id = $1`, id).
		Scan(&r.State, &r.Attempts, &r.Next, &r.Note))
	return r
}

// enqueueAdmin queues an admin message outside any transaction.
func (e *env) enqueueAdmin(t testing.TB, m *email.Mailer, to, content string) int64 {
	t.Helper()
	id, err := m.Enqueue(context.Background(), e.pool, email.Message{
		Kind: email.KindAdminMessage, To: to, DID: e.account(t), Subject: "Hello", Content: content,
	})
	require.NoError(t, err)
	return id
}

func counter(t testing.TB, e *env, name, kind string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if (l.GetName() == "kind" || l.GetName() == "state") && l.GetValue() == kind {
					if m.GetCounter() != nil {
						return m.GetCounter().GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no metric %s{%s}", name, kind)
	return 0
}

// A mail server that is down delays mail: the request's transaction
// commits, and the mail goes out once the server is back (on the same
// port), counted as one retry.
func TestServerDownThenBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	addr := emailtest.FreeAddr(t)
	cfg := e.config(t, plainURL(addr))
	cfg.RetryBase = time.Minute
	m := e.mailer(t, cfg)
	ctx := context.Background()
	did := e.account(t)

	e.sendToken(t, m, did, email.PurposeResetPassword)
	n, err := m.Deliver(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	r := e.row(t, 1)
	require.Equal(t, email.StatePending, r.State)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, e.clock.Now().Add(time.Minute), r.Next.UTC())
	require.Contains(t, r.Note, "connect")
	require.Equal(t, 1.0, counter(t, e, "bulwark_email_retries_total", "reset_password"))

	// While it waits, the code can be read by an operator.
	pending, err := m.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Len(t, pending, 1)

	srv := startSMTP(t, emailtest.Options{Addr: addr})
	n, err = m.Deliver(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "not due before its backoff")
	srv.None(t)

	e.clock.Advance(time.Minute)
	n, err = m.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	code := emailtest.Parse(t, srv.Next(t)).Code(t)
	require.Equal(t, pending[0].Code, code)
	r = e.row(t, 1)
	require.Equal(t, email.StateSent, r.State)
	require.Equal(t, 2, r.Attempts)
	require.Equal(t, 1.0, counter(t, e, "bulwark_email_sent_total", "reset_password"))
	require.Equal(t, 1.0, counter(t, e, "bulwark_email_retries_total", "reset_password"))
	require.Equal(t, 1.0, counter(t, e, "bulwark_email_queue_messages", email.StateSent))
	require.Equal(t, 0.0, counter(t, e, "bulwark_email_queue_messages", email.StatePending))

	// Sent: the code is no longer readable, and still works.
	pending, err = m.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Empty(t, pending)
	did2, err := m.ConsumeByCode(ctx, e.pool, email.PurposeResetPassword, code)
	require.NoError(t, err)
	require.Equal(t, did, did2)
}

// Waits double from RetryBase up to RetryMax; after MaxAttempts the mail
// is failed, logged and kept.
func TestBackoffAndGiveUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config(t, plainURL(emailtest.FreeAddr(t)))
	cfg.RetryBase, cfg.RetryMax, cfg.MaxAttempts = time.Minute, 3*time.Minute, 4
	m := e.mailer(t, cfg)
	ctx := context.Background()
	id := e.enqueueAdmin(t, m, "someone@example.com", "Hi.")

	for i, wait := range []time.Duration{time.Minute, 2 * time.Minute, 3 * time.Minute} {
		_, err := m.Deliver(ctx)
		require.NoError(t, err)
		r := e.row(t, id)
		require.Equal(t, i+1, r.Attempts)
		require.Equal(t, email.StatePending, r.State)
		require.Equal(t, e.clock.Now().Add(wait), r.Next.UTC(), "wait after attempt %d", i+1)
		e.clock.Advance(wait)
	}
	_, err := m.Deliver(ctx)
	require.NoError(t, err)
	r := e.row(t, id)
	require.Equal(t, email.StateFailed, r.State)
	require.Equal(t, 4, r.Attempts)
	require.Contains(t, r.Note, "after 4 attempts")
	require.Equal(t, 3.0, counter(t, e, "bulwark_email_retries_total", "admin_message"))
	require.Equal(t, 1.0, counter(t, e, "bulwark_email_failed_total", "admin_message"))
	require.Equal(t, 1.0, counter(t, e, "bulwark_email_queue_messages", email.StateFailed))
	require.Contains(t, e.logs.String(), "mail failed; giving up")

	// Nothing more is tried, and the failed row outlives sent ones.
	e.clock.Advance(time.Hour)
	_, err = m.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, e.row(t, id).Attempts)
	e.clock.Advance(email.DefaultRetention)
	_, err = m.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{email.StateFailed}, e.states(t))
	e.clock.Advance(email.DefaultFailedRetention)
	_, err = m.Prune(ctx)
	require.NoError(t, err)
	require.Empty(t, e.states(t))
}

// A permanent refusal (550) fails the mail at once; the others in the
// batch still go.
func TestPermanentRefusal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{RejectRcpt: "gone@example.com"})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	bad := e.enqueueAdmin(t, m, "gone@example.com", "one")
	good := e.enqueueAdmin(t, m, "here@example.com", "two")

	n, err := m.Deliver(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"here@example.com"}, srv.Next(t).To)
	r := e.row(t, bad)
	require.Equal(t, email.StateFailed, r.State)
	require.Equal(t, 1, r.Attempts)
	require.Contains(t, r.Note, "550")
	require.Equal(t, email.StateSent, e.row(t, good).State)
}

// Sent and cancelled rows go after Retention; codes a day after expiry.
func TestPrune(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	ctx := context.Background()
	did := e.account(t)
	e.sendToken(t, m, did, email.PurposeConfirmEmail)
	e.sendToken(t, m, did, email.PurposeConfirmEmail)
	_, err := m.Deliver(ctx)
	require.NoError(t, err)
	srv.Next(t)
	require.Equal(t, []string{email.StateCancelled, email.StateSent}, e.states(t))

	tokens := func() int {
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM email_tokens`).Scan(&n))
		return n
	}
	// An expired code is kept a day, so that using it says "expired".
	e.clock.Advance(email.DefaultTokenTTL + 23*time.Hour)
	n, err := m.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, tokens())
	e.clock.Advance(time.Hour + time.Second)
	n, err = m.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Zero(t, tokens())

	// The rows were last touched at the start.
	e.clock.Advance(email.DefaultRetention - 24*time.Hour - email.DefaultTokenTTL - 2*time.Second)
	n, err = m.Prune(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	e.clock.Advance(2 * time.Second)
	n, err = m.Prune(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.Empty(t, e.states(t))
}

// Several nodes' workers share the outbox: every mail goes out exactly once.
func TestTwoNodesSendEachOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	cfg := e.config(t, plainURL(srv.Addr))
	cfg.BatchSize = 3
	a := e.mailer(t, cfg)
	cfg.Registerer = nil
	b, err := email.New(e.pool, cfg)
	require.NoError(t, err)
	const total = 30
	for i := range total {
		e.enqueueAdmin(t, a, fmt.Sprintf("r%d@example.com", i), "hello")
	}

	var wg sync.WaitGroup
	counts := make([]int, 2)
	errs := make([]error, 2)
	for i, m := range []*email.Mailer{a, b} {
		wg.Go(func() { counts[i], errs[i] = m.Deliver(context.Background()) })
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, total, counts[0]+counts[1])
	seen := map[string]bool{}
	for range total {
		to := srv.Next(t).To[0]
		require.False(t, seen[to], "%s twice", to)
		seen[to] = true
	}
	srv.None(t)
}

// The worker wakes on the commit's NOTIFY, not on its (hourly) poll.
func TestWorkerWakesOnNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	cfg := e.config(t, plainURL(srv.Addr))
	cfg.PollInterval = time.Hour
	worker := e.mailer(t, cfg)
	require.NoError(t, worker.Start(context.Background()))
	require.Error(t, worker.Start(context.Background()), "started twice")
	stopped := false
	defer func() {
		if !stopped {
			_ = worker.Stop(context.Background())
		}
	}()

	// Another node queues the mail.
	cfg.Registerer = nil
	other, err := email.New(e.pool, cfg)
	require.NoError(t, err)
	did := e.account(t)
	// The first mail may be found by the worker's first pass or by the
	// wake-up that follows its LISTEN; the second only by a NOTIFY.
	for range 2 {
		e.sendToken(t, other, did, email.PurposePLCOperation)
		p := emailtest.Parse(t, srv.Next(t))
		require.Equal(t, "Confirm a change to your identity on pds.test", p.Subject)
	}
	// Stop waits for the worker to record what it sent.
	require.NoError(t, worker.Stop(context.Background()))
	stopped = true
	require.Equal(t, 2.0, counterSum(t, e, "bulwark_email_sent_total"))
	require.Equal(t, []string{email.StateSent, email.StateSent}, e.states(t))
}

// counterSum sums a counter over its labels.
func counterSum(t testing.TB, e *env, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// A worker stopped mid-batch finishes the mail it is sending, records it,
// and hands the rest back untried: their attempt does not count and they
// are due at once for any node.
func TestStopMidBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	inData := make(chan chan struct{})
	srv := startSMTP(t, emailtest.Options{InData: inData})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	first := e.enqueueAdmin(t, m, "a@example.com", "one")
	second := e.enqueueAdmin(t, m, "b@example.com", "two")

	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := m.Deliver(ctx)
		done <- result{n, err}
	}()
	proceed := <-inData // the first mail is being sent
	cancel()
	close(proceed)
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, 1, res.n)
	require.Equal(t, []string{"a@example.com"}, srv.Next(t).To)

	require.Equal(t, email.StateSent, e.row(t, first).State)
	r := e.row(t, second)
	require.Equal(t, email.StatePending, r.State)
	require.Zero(t, r.Attempts)
	require.Equal(t, e.clock.Now(), r.Next.UTC())
	require.Zero(t, counterSum(t, e, "bulwark_email_retries_total"))
}
