package email_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

func TestRecipientKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"victim@example.com":             "victim@example.com",
		" Victim@Example.COM ":           "victim@example.com",
		"victim+signup1@example.com":     "victim@example.com",
		"victim@example.com.":            "victim@example.com",
		"v.i.c.t.i.m+x@googlemail.com":   "victim@gmail.com",
		"Vic.Tim@gmail.com":              "victim@gmail.com",
		"first.last@example.com":         "first.last@example.com",
		"+leading@example.com":           "+leading@example.com",
		"not-an-address":                 "not-an-address",
		"quoted+tag\"@example.com\"@x.y": "quoted@x.y",
	} {
		require.Equal(t, want, email.RecipientKey(in), in)
	}
}

// TestRecipientLimit: code mails to one mailbox, from several accounts
// and under several spellings, stop at the limit with a
// *RecipientLimitError (nothing issued or queued); another address and an
// administrator's message still go; the address is allowed again once the
// window refills. Only what was admitted reaches the SMTP server.
func TestRecipientLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	cfg := e.config(t, plainURL(srv.Addr))
	cfg.RecipientLimit = ratelimit.MustNew(ratelimit.Config{
		Name: ratelimit.PolicyMailRecipient, Now: e.clock.Now,
		Rules: []ratelimit.Rule{{Name: "5m", Limit: 3, Window: 5 * time.Minute}},
	})
	m := e.mailer(t, cfg)
	send := func(did syntax.DID, to string) error {
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		if err := m.SendToken(ctx, tx, did, to, email.PurposeConfirmEmail, email.TokenData{Handle: "x.pds.test"}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}

	for _, to := range []string{"victim@example.com", "Victim+a@Example.com", "victim+b@example.com"} {
		require.NoError(t, send(e.account(t), to))
	}
	refused := e.account(t)
	err := send(refused, "victim+c@example.com")
	var rl *email.RecipientLimitError
	require.True(t, errors.As(err, &rl), "%v", err)
	require.ErrorIs(t, err, email.ErrRecipientLimited)
	require.Equal(t, 100*time.Second, rl.Decision.RetryAfter.Round(time.Second))
	pending, err := m.PendingTokens(ctx, e.pool, refused)
	require.NoError(t, err)
	require.Empty(t, pending, "no code issued")

	require.NoError(t, send(e.account(t), "someone-else@example.com"))
	require.NoError(t, m.SendAdmin(ctx, e.pool, refused, "victim@example.com", "Notice", "from the operator"))

	n, err := m.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	toVictim := 0
	for range n {
		if r := srv.Next(t); email.RecipientKey(r.To[0]) == "victim@example.com" {
			toVictim++
		}
	}
	require.Equal(t, 4, toVictim, "three codes and the operator's message")
	srv.None(t)

	e.clock.Advance(101 * time.Second)
	require.NoError(t, send(refused, "victim@example.com"), "a mail's worth refilled")
	require.ErrorIs(t, send(refused, "victim@example.com"), email.ErrRecipientLimited)
}
