package email_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
)

// Without SMTP the server still works: mail is held, an operator reads the
// codes, and a node with SMTP sends the held mail later.
func TestHeldThenSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	held := e.mailer(t, email.Config{Now: e.clock.Now, Logger: e.config(t, "").Logger})
	require.True(t, held.Held())
	require.Contains(t, e.logs.String(), "no SMTP server configured")
	ctx := context.Background()
	did := e.account(t)

	e.sendToken(t, held, did, email.PurposeConfirmEmail)
	e.clock.Advance(time.Minute)
	e.sendToken(t, held, did, email.PurposePLCOperation)
	n, err := held.Deliver(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, []string{email.StateHeld, email.StateHeld}, e.states(t))
	require.Equal(t, 2.0, counter(t, e, "bulwark_email_queue_messages", email.StateHeld))

	pending, err := held.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Len(t, pending, 2)
	require.Equal(t, email.PurposeConfirmEmail, pending[0].Purpose)
	require.Equal(t, e.clock.Now().Add(email.DefaultTokenTTL-time.Minute), pending[0].ExpiresAt.UTC())
	require.Equal(t, email.PurposePLCOperation, pending[1].Purpose)
	other, err := held.PendingTokens(ctx, e.pool, e.account(t))
	require.NoError(t, err)
	require.Empty(t, other, "only the account's own codes")

	// The operator passes the PLC code on and it is used: its mail is no
	// longer worth sending, and the code is no longer readable.
	require.NoError(t, e.consume(t, held, did, email.PurposePLCOperation, pending[1].Code))
	left, err := held.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Equal(t, pending[:1], left)
	var stored *string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT code FROM email_outbox WHERE purpose = 'plc_operation'`).Scan(&stored))
	require.Nil(t, stored)

	// SMTP is configured later: the held confirmation goes out.
	srv := startSMTP(t, emailtest.Options{})
	cfg := e.config(t, plainURL(srv.Addr))
	sender, err := email.New(e.pool, cfg)
	require.NoError(t, err)
	n, err = sender.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	p := emailtest.Parse(t, srv.Next(t))
	require.Equal(t, pending[0].Code, p.Code(t))
	require.Contains(t, p.Text, "14 minutes", "the lifetime left when it is sent")
	srv.None(t)
	require.Equal(t, []string{email.StateSent, email.StateCancelled}, e.states(t))
	left, err = held.PendingTokens(ctx, e.pool, did)
	require.NoError(t, err)
	require.Empty(t, left)
}

// A held mail whose code expires is cancelled by the held node's own
// worker pass, and its code cleared.
func TestHeldExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	held := e.mailer(t, email.Config{Now: e.clock.Now, Logger: e.config(t, "").Logger})
	did := e.account(t)
	e.sendToken(t, held, did, email.PurposeResetPassword)
	e.clock.Advance(email.DefaultTokenTTL)
	_, err := held.Deliver(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{email.StateCancelled}, e.states(t))
	var stored *string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT code FROM email_outbox`).Scan(&stored))
	require.Nil(t, stored)
}

// Deleting an account takes its codes and mail with it.
func TestAccountDeletionCascades(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	held := e.mailer(t, email.Config{Now: e.clock.Now, Logger: e.config(t, "").Logger})
	did := e.account(t)
	e.sendToken(t, held, did, email.PurposeDeleteAccount)
	_, err := e.pool.Exec(context.Background(), `DELETE FROM accounts WHERE did = $1`, did.String())
	require.NoError(t, err)
	require.Empty(t, e.states(t))
	var tokens int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM email_tokens`).Scan(&tokens))
	require.Zero(t, tokens)
}
