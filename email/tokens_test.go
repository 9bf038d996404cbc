package email_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
)

// A code arrives by mail in both a text and an HTML part, works once, and
// the second use fails.
func TestTokenByMailWorksOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	did := e.account(t)

	e.sendToken(t, m, did, email.PurposeConfirmEmail)
	n, err := m.Deliver(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	r := srv.Next(t)
	require.Equal(t, []string{"owner@example.com"}, r.To)
	require.Equal(t, "noreply@pds.test", r.From)
	require.Equal(t, smtpUser, r.User)
	p := emailtest.Parse(t, r)
	require.Equal(t, "Confirm your email address on pds.test", p.Subject)
	code := p.Code(t)
	require.Contains(t, p.Text, "@alice.pds.test")
	require.Contains(t, p.Text, "15 minutes")
	require.Contains(t, p.HTML, "<p style=")
	require.Contains(t, p.HTML, code)
	require.NotEmpty(t, p.Header.Get("Message-Id"))

	// Not for another purpose or account.
	require.ErrorIs(t, e.consume(t, m, did, email.PurposeResetPassword, code), email.ErrTokenInvalid)
	require.ErrorIs(t, e.consume(t, m, e.account(t), email.PurposeConfirmEmail, code), email.ErrTokenInvalid)
	// A wrong code leaves the right one usable.
	require.ErrorIs(t, e.consume(t, m, did, email.PurposeConfirmEmail, "AAAAA-AAAAA"), email.ErrTokenInvalid)

	require.NoError(t, e.consume(t, m, did, email.PurposeConfirmEmail, code))
	require.ErrorIs(t, e.consume(t, m, did, email.PurposeConfirmEmail, code), email.ErrTokenInvalid)

	// Sent: the plain code is gone from the outbox.
	var stored *string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT code FROM email_outbox`).Scan(&stored))
	require.Nil(t, stored)
	require.Equal(t, []string{email.StateSent}, e.states(t))
}

// A rolled-back transaction uses no code.
func TestConsumeRolledBackKeepsCode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.mailer(t, e.config(t, ""))
	did := e.account(t)
	ctx := context.Background()
	code, err := m.Issue(ctx, e.pool, did, email.PurposePLCOperation)
	require.NoError(t, err)

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Consume(ctx, tx, did, email.PurposePLCOperation, code))
	require.NoError(t, tx.Rollback(ctx))

	// As a person might type it: lower case, no dash, a 0 for an O.
	typed := strings.ToLower(strings.ReplaceAll(code, "-", ""))
	typed = strings.ReplaceAll(typed, "o", "0")
	require.NoError(t, e.consume(t, m, did, email.PurposePLCOperation, typed))
}

// A code is expired after 15 minutes, and its mail, if not sent by then,
// is not sent at all.
func TestTokenExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	did := e.account(t)
	ctx := context.Background()

	e.sendToken(t, m, did, email.PurposeDeleteAccount)
	_, err := m.Deliver(ctx)
	require.NoError(t, err)
	code := emailtest.Parse(t, srv.Next(t)).Code(t)

	e.clock.Advance(email.DefaultTokenTTL - time.Second)
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Consume(ctx, tx, did, email.PurposeDeleteAccount, code), "valid just before expiry")
	require.NoError(t, tx.Rollback(ctx))

	e.clock.Advance(time.Second)
	require.ErrorIs(t, e.consume(t, m, did, email.PurposeDeleteAccount, code), email.ErrTokenExpired)
	// Wrong is still wrong, not expired.
	require.ErrorIs(t, e.consume(t, m, did, email.PurposeDeleteAccount, "AAAAA-AAAAA"), email.ErrTokenInvalid)

	// A mail still queued when its code expires is cancelled, not sent.
	e.sendToken(t, m, did, email.PurposeDeleteAccount)
	e.clock.Advance(email.DefaultTokenTTL)
	n, err := m.Deliver(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	srv.None(t)
	require.Equal(t, []string{email.StateSent, email.StateCancelled}, e.states(t))
	pending, err := m.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Empty(t, pending)
}

// A new request replaces the old code; mail with the old code that has not
// gone out yet is cancelled.
func TestNewRequestReplacesOld(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	did := e.account(t)
	ctx := context.Background()

	e.sendToken(t, m, did, email.PurposeUpdateEmail)
	_, err := m.Deliver(ctx)
	require.NoError(t, err)
	first := emailtest.Parse(t, srv.Next(t)).Code(t)

	e.sendToken(t, m, did, email.PurposeUpdateEmail)
	e.sendToken(t, m, did, email.PurposeUpdateEmail) // before the second went out
	n, err := m.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	third := emailtest.Parse(t, srv.Next(t)).Code(t)
	srv.None(t)
	require.Equal(t, []string{email.StateSent, email.StateCancelled, email.StateSent}, e.states(t))

	require.ErrorIs(t, e.consume(t, m, did, email.PurposeUpdateEmail, first), email.ErrTokenInvalid)
	require.NoError(t, e.consume(t, m, did, email.PurposeUpdateEmail, third))
}

// resetPassword names no account: the code alone finds it.
func TestConsumeByCode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.mailer(t, e.config(t, ""))
	ctx := context.Background()
	alice, bob := e.account(t), e.account(t)
	aliceCode, err := m.Issue(ctx, e.pool, alice, email.PurposeResetPassword)
	require.NoError(t, err)
	_, err = m.Issue(ctx, e.pool, bob, email.PurposeResetPassword)
	require.NoError(t, err)
	plcCode, err := m.Issue(ctx, e.pool, alice, email.PurposePLCOperation)
	require.NoError(t, err)

	_, err = m.ConsumeByCode(ctx, e.pool, email.PurposeResetPassword, plcCode)
	require.ErrorIs(t, err, email.ErrTokenInvalid, "a code of another purpose")
	for _, bad := range []string{"", "nope", strings.Repeat("A", 100), "AAAAA-AAAA!"} {
		_, err = m.ConsumeByCode(ctx, e.pool, email.PurposeResetPassword, bad)
		require.ErrorIs(t, err, email.ErrTokenInvalid, bad)
	}
	did, err := m.ConsumeByCode(ctx, e.pool, email.PurposeResetPassword, strings.ToLower(aliceCode))
	require.NoError(t, err)
	require.Equal(t, alice, did)
	_, err = m.ConsumeByCode(ctx, e.pool, email.PurposeResetPassword, aliceCode)
	require.ErrorIs(t, err, email.ErrTokenInvalid, "used")

	bobCode, err := m.Issue(ctx, e.pool, bob, email.PurposeResetPassword)
	require.NoError(t, err)
	e.clock.Advance(email.DefaultTokenTTL)
	_, err = m.ConsumeByCode(ctx, e.pool, email.PurposeResetPassword, bobCode)
	require.ErrorIs(t, err, email.ErrTokenExpired)

	_, err = m.Issue(ctx, e.pool, bob, email.Purpose("auth_factor"))
	require.ErrorIs(t, err, email.ErrInvalidPurpose)
}

// Codes have the reference PDS's shape and do not repeat.
func TestCodeShape(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.mailer(t, e.config(t, ""))
	did := e.account(t)
	seen := map[string]bool{}
	for range 50 {
		code, err := m.Issue(context.Background(), e.pool, did, email.PurposeConfirmEmail)
		require.NoError(t, err)
		require.Regexp(t, `^[A-Z2-7]{5}-[A-Z2-7]{5}$`, code)
		require.False(t, seen[code])
		seen[code] = true
	}
	// Only a hash is stored.
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM email_tokens WHERE octet_length(code_hash) = 32`).Scan(&n))
	require.Equal(t, 1, n)
}

// Two requests racing with the same code: one wins, the other is refused.
func TestConsumeRace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.mailer(t, e.config(t, ""))
	did := e.account(t)
	ctx := context.Background()
	code, err := m.Issue(ctx, e.pool, did, email.PurposeDeleteAccount)
	require.NoError(t, err)

	first, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Consume(ctx, first, did, email.PurposeDeleteAccount, code))
	// The second waits for the first's row lock, then finds the code gone.
	second := make(chan error, 1)
	go func() {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			second <- err
			return
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := m.Consume(ctx, tx, did, email.PurposeDeleteAccount, code); err != nil {
			second <- err
			return
		}
		second <- tx.Commit(ctx)
	}()
	e.waitForLockWaiter(t)
	require.NoError(t, first.Commit(ctx))
	require.ErrorIs(t, <-second, email.ErrTokenInvalid)
}

// RevokeAll (an email address change) ends every code of the account and
// cancels their mail.
func TestRevokeAll(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.mailer(t, email.Config{Now: e.clock.Now, Logger: e.config(t, "").Logger})
	ctx := context.Background()
	did, other := e.account(t), e.account(t)
	e.sendToken(t, m, did, email.PurposeConfirmEmail)
	e.sendToken(t, m, did, email.PurposeUpdateEmail)
	e.sendToken(t, m, other, email.PurposeUpdateEmail)
	pending, err := m.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Len(t, pending, 2)

	require.NoError(t, m.RevokeAll(ctx, e.pool, did))
	for _, p := range pending {
		require.ErrorIs(t, e.consume(t, m, did, p.Purpose, p.Code), email.ErrTokenInvalid)
	}
	left, err := m.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Empty(t, left)
	require.Equal(t, []string{email.StateCancelled, email.StateCancelled, email.StateHeld}, e.states(t))
	left, err = m.PendingTokens(ctx, e.pool, other)
	require.NoError(t, err)
	require.Len(t, left, 1)
}

// waitForLockWaiter returns once a session of the test's database waits
// for a row lock.
func (e *env) waitForLockWaiter(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting int
		err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting == 1
	}, 30*time.Second, 5*time.Millisecond, "a second transaction waits for the first's lock")
}

// Two requests for a code at once: the later one's code is the live one,
// and the earlier one's mail is cancelled, whatever the interleaving.
func TestConcurrentRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.mailer(t, email.Config{Now: e.clock.Now, Logger: e.config(t, "").Logger})
	did := e.account(t)
	ctx := context.Background()

	first, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	require.NoError(t, m.SendToken(ctx, first, did, "u@example.com", email.PurposeConfirmEmail, email.TokenData{}))
	second := make(chan error, 1)
	go func() {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			second <- err
			return
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := m.SendToken(ctx, tx, did, "u@example.com", email.PurposeConfirmEmail, email.TokenData{}); err != nil {
			second <- err
			return
		}
		second <- tx.Commit(ctx)
	}()
	e.waitForLockWaiter(t)
	require.NoError(t, first.Commit(ctx))
	require.NoError(t, <-second)

	require.Equal(t, []string{email.StateCancelled, email.StateHeld}, e.states(t))
	pending, err := m.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.NoError(t, e.consume(t, m, did, email.PurposeConfirmEmail, pending[0].Code))
}
