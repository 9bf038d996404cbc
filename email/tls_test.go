package email_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
)

// Mail goes out over TLS, implicit (smtps://) or upgraded with STARTTLS
// (smtp://), to a server whose certificate the TLSConfig trusts.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, roots := emailtest.SelfSigned(t)
	for _, tc := range []struct {
		name   string
		mode   emailtest.TLSMode
		scheme string
	}{
		{"implicit", emailtest.Implicit, "smtps"},
		{"starttls", emailtest.StartTLS, "smtp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			srv := startSMTP(t, emailtest.Options{TLS: tc.mode, Cert: cert})
			cfg := e.config(t, fmt.Sprintf("%s://%s:%s@%s", tc.scheme, smtpUser, smtpPass, srv.Addr))
			cfg.TLSConfig = &tls.Config{RootCAs: roots}
			m := e.mailer(t, cfg)
			e.sendToken(t, m, e.account(t), email.PurposeConfirmEmail)
			n, err := m.Deliver(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, n)
			r := srv.Next(t)
			require.True(t, r.TLS)
			require.Equal(t, smtpUser, r.User)
			emailtest.Parse(t, r).Code(t)
		})
	}
}

// An untrusted certificate is not accepted: the mail waits.
func TestTLSUntrusted(t *testing.T) {
	t.Parallel()
	cert, _ := emailtest.SelfSigned(t)
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{TLS: emailtest.Implicit, Cert: cert})
	m := e.mailer(t, e.config(t, fmt.Sprintf("smtps://%s:%s@%s", smtpUser, smtpPass, srv.Addr)))
	id := e.enqueueAdmin(t, m, "x@example.com", "hi")
	n, err := m.Deliver(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	r := e.row(t, id)
	require.Equal(t, email.StatePending, r.State)
	require.Contains(t, r.Note, "certificate")
	srv.None(t)
}

// smtp:// requires STARTTLS: against a server that does not offer it
// (or a man in the middle who hid the offer) nothing is sent, not even
// the password.
func TestStartTLSRequired(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, fmt.Sprintf("smtp://%s:%s@%s", smtpUser, smtpPass, srv.Addr)))
	id := e.enqueueAdmin(t, m, "x@example.com", "hi")
	n, err := m.Deliver(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	r := e.row(t, id)
	require.Equal(t, email.StatePending, r.State)
	require.Contains(t, r.Note, "STARTTLS")
	require.Zero(t, srv.Auths(), "no AUTH without TLS")
	srv.None(t)
}

// The password appears in no log line and no outbox row, whether the
// login works or not; the configuration logs redacted.
func TestNoPasswordInLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	e.sendToken(t, m, e.account(t), email.PurposeConfirmEmail)
	_, err := m.Deliver(context.Background())
	require.NoError(t, err)
	code := emailtest.Parse(t, srv.Next(t)).Code(t)

	// A wrong password: the server's refusal is logged and stored.
	wrong := strings.Replace(plainURL(srv.Addr), smtpPass, "wrong-"+smtpPass, 1)
	cfg := e.config(t, wrong)
	bad, err := email.New(e.pool, cfg)
	require.NoError(t, err)
	id := e.enqueueAdmin(t, bad, "x@example.com", "hi")
	_, err = bad.Deliver(context.Background())
	require.NoError(t, err)
	require.Contains(t, e.row(t, id).Note, "535")

	logs := e.logs.String()
	require.Contains(t, logs, "smtp://bulwark:xxxxx@")
	require.Contains(t, logs, "mail not sent; will retry")
	mustContainNone(t, logs, smtpPass, code)
	var notes string
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT string_agg(note || data::text, ' ') FROM email_outbox`).Scan(&notes))
	mustContainNone(t, notes, smtpPass)
}
