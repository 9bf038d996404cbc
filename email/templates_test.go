package email_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
	"github.com/bulwark-pds/bulwark/email/emailtest"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
	}
	return dir
}

// An operator's file replaces the default of the same name; a kind's files
// missing from the directory fall back to the defaults.
func TestTemplateOverride(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	cfg := e.config(t, plainURL(srv.Addr))
	cfg.TemplateDir = writeFiles(t, map[string]string{
		"reset_password.subject.txt": "{{.Hostname}}: password code for {{.Handle}}",
		"reset_password.txt":         "Your code: {{.Token}} (until {{.ExpiresAt.Format \"15:04 MST\"}})\n",
	})
	m := e.mailer(t, cfg)
	e.sendToken(t, m, e.account(t), email.PurposeResetPassword)
	e.sendToken(t, m, e.account(t), email.PurposeConfirmEmail)
	n, err := m.Deliver(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, n)

	p := emailtest.Parse(t, srv.Next(t))
	require.Equal(t, "pds.test: password code for alice.pds.test", p.Subject)
	code := p.Code(t)
	require.Equal(t, "Your code: "+code+" (until 12:15 UTC)\n", p.Text)
	// The HTML part is the default's, with the subject as its title.
	require.Contains(t, p.HTML, "<title>pds.test: password code for alice.pds.test</title>")
	require.Contains(t, p.HTML, "reset the password")
	require.Contains(t, p.HTML, code)

	other := emailtest.Parse(t, srv.Next(t))
	require.Equal(t, "Confirm your email address on pds.test", other.Subject)
}

// An operator's layout.html draws every kind that calls it, each keeping
// its content and, where it defines one, its signature; a KIND.html that
// is a whole page of its own does without it.
func TestTemplateLayoutOverride(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	cfg := e.config(t, plainURL(srv.Addr))
	cfg.TemplateDir = writeFiles(t, map[string]string{
		"layout.html":        `<div class="operator">{{template "content" .}}<footer>{{block "signature" .}}Team {{.Hostname}}{{end}}</footer></div>`,
		"confirm_email.html": `<p>Whole page: {{.Token}}</p>`,
	})
	m := e.mailer(t, cfg)
	ctx := context.Background()
	e.sendToken(t, m, e.account(t), email.PurposeResetPassword)
	e.sendToken(t, m, e.account(t), email.PurposeConfirmEmail)
	require.NoError(t, m.SendAdmin(ctx, e.pool, e.account(t), "u@example.com", "", "Hello"))
	n, err := m.Deliver(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	reset := emailtest.Parse(t, srv.Next(t))
	require.Contains(t, reset.HTML, `<div class="operator">`)
	require.Contains(t, reset.HTML, "reset the password")
	require.Contains(t, reset.HTML, reset.Code(t))
	require.Contains(t, reset.HTML, "<footer>Team pds.test</footer>")

	confirm := emailtest.Parse(t, srv.Next(t))
	require.Contains(t, confirm.HTML, "<p>Whole page: "+confirm.Code(t)+"</p>")
	require.NotContains(t, confirm.HTML, "operator")

	admin := emailtest.Parse(t, srv.Next(t))
	require.Contains(t, admin.HTML, `<div class="operator">`)
	require.Contains(t, admin.HTML, "Hello")
	require.Contains(t, admin.HTML, "<footer>The administrator of pds.test</footer>")
}

// A broken override stops start-up, naming the file.
func TestTemplateOverrideBroken(t *testing.T) {
	t.Parallel()
	for name, files := range map[string]map[string]string{
		"parse":         {"confirm_email.html": "<p>{{.Token</p>"},
		"unknown field": {"plc_operation.txt": "{{.Password}}"},
		"empty subject": {"admin_message.subject.txt": "{{if false}}x{{end}}"},
		"html context":  {"delete_account.html": "<a href=\"{{.Token}}"},
		"layout":        {"layout.html": "{{template \"content\" .}"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := email.New(nil, email.Config{TemplateDir: writeFiles(t, files)})
			require.ErrorIs(t, err, email.ErrTemplate)
			for f := range files {
				require.Contains(t, err.Error(), f)
			}
		})
	}
	_, err := email.New(nil, email.Config{TemplateDir: filepath.Join(t.TempDir(), "missing")})
	require.ErrorIs(t, err, email.ErrInvalidConfig)
}

// HTML templates escape what they are given: an administrator's content
// cannot inject markup, and the subject stays one header line.
func TestAdminMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	ctx := context.Background()
	did := e.account(t)
	require.NoError(t, m.SendAdmin(ctx, e.pool, did, "User <u@example.com>", "About\r\nBcc: x@evil.test", "Line one\n<script>alert(1)</script>"))
	require.NoError(t, m.SendAdmin(ctx, e.pool, did, "u@example.com", "", "Second"))
	_, err := m.Deliver(ctx)
	require.NoError(t, err)

	r := srv.Next(t)
	require.Equal(t, []string{"u@example.com"}, r.To)
	p := emailtest.Parse(t, r)
	require.Equal(t, "About Bcc: x@evil.test", p.Subject)
	require.Empty(t, p.Header.Get("Bcc"))
	require.Contains(t, p.Text, "Line one\n<script>alert(1)</script>")
	require.Contains(t, p.HTML, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.NotContains(t, p.HTML, "<script>")
	require.Equal(t, "Message from the administrator of pds.test", emailtest.Parse(t, srv.Next(t)).Subject)

	for _, bad := range []email.Message{
		{Kind: email.KindAdminMessage, To: "not an address", Content: "x"},
		{Kind: email.KindAdminMessage, To: strings.Repeat("a", 250) + "@example.com", Content: "x"},
		{Kind: email.KindAdminMessage, To: "u@example.com", Content: strings.Repeat("x", email.MaxAdminContentLen+1)},
		{Kind: email.KindAdminMessage, To: "u@example.com", Subject: strings.Repeat("s", email.MaxAdminSubjectLen+1), Content: "x"},
		{Kind: email.KindAdminMessage, To: "u@example.com", Content: "  "},
		{Kind: email.KindAdminMessage, To: "u@example.com", Content: "\xff"},
		{Kind: email.KindConfirmEmail, To: "u@example.com"},
		{Kind: "newsletter", To: "u@example.com", Content: "x"},
	} {
		_, err := m.Enqueue(ctx, e.pool, bad)
		require.ErrorIs(t, err, email.ErrInvalidMessage)
	}
	err = m.SendToken(ctx, e.pool, did, "nobody", email.PurposeConfirmEmail, email.TokenData{})
	require.ErrorIs(t, err, email.ErrInvalidMessage)
	require.Len(t, e.states(t), 2, "nothing written for bad input")
	var tokens int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM email_tokens`).Scan(&tokens))
	require.Zero(t, tokens, "no code issued for an unusable address")
}

// A mail queued in a transaction that rolls back never exists.
func TestEnqueueRollback(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := startSMTP(t, emailtest.Options{})
	m := e.mailer(t, e.config(t, plainURL(srv.Addr)))
	ctx := context.Background()
	did := e.account(t)
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, m.SendToken(ctx, tx, did, "u@example.com", email.PurposeConfirmEmail, email.TokenData{}))
	require.NoError(t, tx.Rollback(ctx))
	n, err := m.Deliver(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	srv.None(t)
	require.Empty(t, e.states(t))
}
