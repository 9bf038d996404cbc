package pds

import (
	"context"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/internal/testclock"
)

// Fixtures of the mail tests: a Mailer on a hand-moved clock, and a helper
// that takes a code out of the held outbox. The SMTP server they send to is
// email/emailtest's.

// mailEnv is an accountEnv whose Mailer sends to sink (nil: no SMTP, mail
// is held) on clock.
type mailEnv struct {
	*accountEnv
	clock *testclock.Clock
	logs  *lockedBuffer
}

// newMailEnv builds it. worker runs the Mailer's worker as serve does;
// without it the test calls Deliver itself. opts adjusts the rest.
func newMailEnv(t testing.TB, smtpURL string, worker bool, opts envOptions) *mailEnv {
	t.Helper()
	clock := testclock.New(time.Now())
	logs := &lockedBuffer{}
	cfg := &email.Config{From: "Bulwark <noreply@pds.test>", Now: clock.Now, SendTimeout: 10 * time.Second}
	if smtpURL != "" {
		sc, err := email.ParseSMTPURL(smtpURL)
		require.NoError(t, err)
		cfg.SMTP = sc
	}
	opts.mail = cfg
	opts.logs = logs
	e := &mailEnv{accountEnv: newAccountEnv(t, opts), clock: clock, logs: logs}
	if worker {
		m := e.accounts.Mail()
		require.NoError(t, m.Start(context.Background()))
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
	}
	return e
}

// deliver runs one round of the Mailer's worker and returns how many mails
// went out.
func (e *mailEnv) deliver(t testing.TB) int {
	t.Helper()
	n, err := e.accounts.Mail().Deliver(context.Background())
	require.NoError(t, err)
	return n
}

// heldCode is did's code for purpose, read from the outbox (mail not
// sent), or "".
func (e *accountEnv) heldCode(t testing.TB, did syntax.DID, purpose email.Purpose) string {
	t.Helper()
	pending, err := e.accounts.PendingEmailTokens(context.Background(), did)
	require.NoError(t, err)
	for _, p := range pending {
		if p.Purpose == purpose {
			return p.Code
		}
	}
	return ""
}

// deleteOwnAccount deletes u's account as its holder does: a
// delete_account code (read from the held outbox), then deleteAccount.
func (e *accountEnv) deleteOwnAccount(t testing.TB, u *user) xrpcResult {
	t.Helper()
	e.post(t, "com.atproto.server.requestAccountDelete", u.access, nil).ok(t)
	code := e.heldCode(t, u.did, email.PurposeDeleteAccount)
	require.NotEmpty(t, code)
	return e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": code})
}
