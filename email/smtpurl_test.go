package email_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
)

func TestParseSMTPURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw      string
		host     string
		port     int
		user     string
		tls      email.TLSMode
		redacted string
	}{
		{"smtps://user:pass@mail.example.com", "mail.example.com", 465, "user", email.TLSImplicit, "smtps://user:xxxxx@mail.example.com:465"},
		{"smtps://user:pass@mail.example.com:2465", "mail.example.com", 2465, "user", email.TLSImplicit, "smtps://user:xxxxx@mail.example.com:2465"},
		{"smtp://user:pass@mail.example.com", "mail.example.com", 587, "user", email.TLSStartTLS, "smtp://user:xxxxx@mail.example.com:587"},
		{"SMTP://mail.example.com:25?tls=starttls", "mail.example.com", 25, "", email.TLSStartTLS, "smtp://mail.example.com:25"},
		{"smtp://u%40x.com:p%3Ass%40@[::1]:2525?tls=none", "::1", 2525, "u@x.com", email.TLSNone, "smtp://u%40x.com:xxxxx@[::1]:2525?tls=none"},
		{"smtp://localhost:1025?tls=none", "localhost", 1025, "", email.TLSNone, "smtp://localhost:1025?tls=none"},
		{"  smtp://127.0.0.1/  ", "127.0.0.1", 587, "", email.TLSStartTLS, "smtp://127.0.0.1:587"},
	} {
		c, err := email.ParseSMTPURL(tc.raw)
		require.NoError(t, err, tc.raw)
		require.Equal(t, tc.host, c.Host, tc.raw)
		require.Equal(t, tc.port, c.Port, tc.raw)
		require.Equal(t, tc.user, c.Username, tc.raw)
		require.Equal(t, tc.user != "", c.HasPassword(), tc.raw)
		require.Equal(t, tc.tls, c.TLS, tc.raw)
		require.Equal(t, tc.redacted, c.String(), tc.raw)
	}
}

func TestParseSMTPURLRejects(t *testing.T) {
	t.Parallel()
	const secret = "Hunter2-secret"
	for _, raw := range []string{
		"",
		"http://mail.example.com",
		"mail.example.com:465",
		"smtps://",
		"smtps://user@mail.example.com",
		"smtps://:" + secret + "@mail.example.com",
		"smtp://user:" + secret + "@mail.example.com:0",
		"smtp://user:" + secret + "@mail.example.com:99999",
		"smtp://user:" + secret + "@mail.example.com:port",
		"smtp://user:" + secret + "@mail.example.com/path",
		"smtp://user:" + secret + "@mail.example.com#frag",
		"smtp://user:" + secret + "@mail.example.com?tls=none",
		"smtp://user:" + secret + "@10.0.0.1?tls=none",
		"smtp://user:" + secret + "@mail.example.com?tls=maybe",
		"smtp://user:" + secret + "@mail.example.com?auth=plain",
		"smtps://user:" + secret + "@mail.example.com?tls=none",
		"smtp://user:" + secret + "%zz@mail.example.com",
		"smtp://user:" + secret + " x@mail.example.com",
		"smtp://mail.example.com/" + strings.Repeat("a", 3000),
	} {
		_, err := email.ParseSMTPURL(raw)
		require.ErrorIs(t, err, email.ErrInvalidSMTPURL, raw)
		require.NotContains(t, err.Error(), secret, raw)
	}
}

// Every way of printing or logging the config hides the password.
func TestSMTPConfigRedacted(t *testing.T) {
	t.Parallel()
	const secret = "Hunter2-secret"
	c, err := email.ParseSMTPURL("smtps://user:" + secret + "@mail.example.com")
	require.NoError(t, err)
	var b bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&b, nil))
	log.Info("config", "smtp", c, "value", *c)
	for _, s := range []string{
		fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c),
		fmt.Sprintf("%v %+v %#v %s", *c, *c, *c, *c), b.String(),
	} {
		require.NotContains(t, s, secret)
		require.Contains(t, s, "smtps://user:xxxxx@mail.example.com:465")
	}
}

// New refuses configurations it could not send with.
func TestNewRejectsConfig(t *testing.T) {
	t.Parallel()
	ok, err := email.ParseSMTPURL("smtps://user:pass@mail.example.com")
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		cfg  email.Config
		want error
	}{
		"no sender":        {email.Config{SMTP: ok}, email.ErrInvalidConfig},
		"bad sender":       {email.Config{SMTP: ok, From: "not an address"}, email.ErrInvalidConfig},
		"plain off-host":   {email.Config{SMTP: &email.SMTPConfig{Host: "mail.example.com", Port: 25, TLS: email.TLSNone}, From: "a@b.c"}, email.ErrInvalidSMTPURL},
		"user, no pass":    {email.Config{SMTP: &email.SMTPConfig{Host: "mail.example.com", Port: 465, Username: "u", TLS: email.TLSImplicit}, From: "a@b.c"}, email.ErrInvalidSMTPURL},
		"no port":          {email.Config{SMTP: &email.SMTPConfig{Host: "mail.example.com", TLS: email.TLSImplicit}, From: "a@b.c"}, email.ErrInvalidSMTPURL},
		"unknown TLS mode": {email.Config{SMTP: &email.SMTPConfig{Host: "mail.example.com", Port: 25, TLS: "maybe"}, From: "a@b.c"}, email.ErrInvalidSMTPURL},
	} {
		_, err := email.New(nil, tc.cfg)
		require.ErrorIs(t, err, tc.want, name)
	}
	m, err := email.New(nil, email.Config{SMTP: ok, From: "Bulwark <noreply@pds.example.com>"})
	require.NoError(t, err)
	require.False(t, m.Held())
}
