package config

import (
	"bytes"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEmailSettings(t *testing.T) {
	t.Parallel()
	const url = "smtps://mailer:smtphunter2@mail.example.com"
	c, err := parse(t, nil, "--smtp-url", url, "--email-from", "Example PDS <noreply@example.com>")
	require.NoError(t, err)
	sc, err := c.SMTP()
	require.NoError(t, err)
	require.Equal(t, "mail.example.com", sc.Host)
	require.Equal(t, 465, sc.Port)

	// Nowhere shown with its password: the start-up log, Redacted, --help.
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	require.NotContains(t, buf.String(), "smtphunter2")
	require.Contains(t, buf.String(), `"smtp-url":"smtps://mailer:xxxxx@mail.example.com:465"`)
	require.Equal(t, "smtps://mailer:xxxxx@mail.example.com:465", c.Redacted().SMTPURL)
	require.Equal(t, url, c.SMTPURL, "redaction works on a copy")
	require.Equal(t, RedactedText, RedactSMTPURL("smtp://u:smtphunter2@host:bad"), "an unparsable URL is hidden whole")

	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	env := map[string]string{"BULWARK_SMTP_URL": url}
	DefaultConfig().registerFlags(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.PrintDefaults()
	require.NotContains(t, help.String(), "smtphunter2")
	require.Contains(t, help.String(), "BULWARK_SMTP_URL")

	// No SMTP server: valid, mail is held.
	c, err = parse(t, nil)
	require.NoError(t, err)
	sc, err = c.SMTP()
	require.NoError(t, err)
	require.Nil(t, sc)
}

func TestEmailSettingsInvalid(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "not-a-dir")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"smtp url scheme", nil, []string{"--smtp-url", "http://u:smtphunter2@mail.example.com", "--email-from", "a@example.com"}, "--smtp-url"},
		{"smtp url bad port", nil, []string{"--smtp-url", "smtp://u:smtphunter2@mail.example.com:0", "--email-from", "a@example.com"}, "--smtp-url"},
		{"smtp url plain text off loopback", nil, []string{"--smtp-url", "smtp://u:smtphunter2@mail.example.com?tls=none", "--email-from", "a@example.com"}, "--smtp-url"},
		{"env smtp url", map[string]string{"BULWARK_SMTP_URL": "smtps://u:smtphunter2@"}, []string{"--email-from", "a@example.com"}, "BULWARK_SMTP_URL"},
		{"smtp without sender", nil, []string{"--smtp-url", "smtps://u:smtphunter2@mail.example.com"}, "--email-from"},
		{"bad sender", nil, []string{"--email-from", "nobody"}, "--email-from"},
		{"templates missing", nil, []string{"--email-templates", filepath.Join(file, "nope")}, "--email-templates"},
		{"templates not a directory", nil, []string{"--email-templates", file}, "--email-templates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(t, tt.env, tt.args...)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "smtphunter2")
		})
	}
}
