package config

import (
	"bytes"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The relay watch, alert and console settings: defaults, the environment,
// validation, and the webhook kept out of every print.
func TestOpsSettings(t *testing.T) {
	t.Parallel()
	c, err := parse(t, nil)
	require.NoError(t, err)
	require.Equal(t, time.Minute, c.RelayWatchInterval)
	require.Equal(t, 10*time.Second, c.RelayWatchTimeout)
	require.Equal(t, 10000, c.RelayBehindEvents)
	require.Equal(t, 5*time.Minute, c.RelayBehindFor)
	require.Equal(t, 2, c.RelayStuckChecks)
	require.Equal(t, 30*time.Second, c.RelayStuckFor)
	require.Equal(t, 100, c.OverloadStormThreshold)
	require.Equal(t, ConsolePublic, c.AdminConsole)
	require.Empty(t, c.AlertWebhook)

	hook := "https://hooks.example.com/services/T0/B0/hooksecret42"
	c, err = parse(t, map[string]string{
		"BULWARK_RELAY_WATCH_INTERVAL": "0", "BULWARK_RELAY_STUCK_CHECKS": "5",
		"BULWARK_ALERT_WEBHOOK": hook, "BULWARK_OVERLOAD_STORM_THRESHOLD": "20",
		"BULWARK_ADMIN_CONSOLE": "off",
	})
	require.NoError(t, err)
	require.Zero(t, c.RelayWatchInterval)
	require.Equal(t, 5, c.RelayStuckChecks)
	require.Equal(t, hook, c.AlertWebhook)
	require.Equal(t, 20, c.OverloadStormThreshold)
	require.Equal(t, ConsoleOff, c.AdminConsole)

	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	require.NotContains(t, buf.String(), "hooksecret42")
	require.Contains(t, buf.String(), `"alert-webhook":"(redacted)"`)
	require.Equal(t, RedactedText, c.Redacted().AlertWebhook)
	for _, s := range c.Settings() {
		require.NotContains(t, s.Value, "hooksecret42")
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var help bytes.Buffer
	fs.SetOutput(&help)
	c.RegisterFlags(fs)
	fs.PrintDefaults()
	require.NotContains(t, help.String(), "hooksecret42")
	require.Contains(t, help.String(), "BULWARK_ALERT_WEBHOOK")

	for _, bad := range [][]string{
		{"--relay-watch-interval", "-1s"}, {"--relay-watch-timeout", "0s"}, {"--relay-watch-timeout", "2m"},
		{"--relay-behind-events", "0"}, {"--relay-behind-for", "0s"}, {"--relay-stuck-checks", "0"},
		{"--alert-webhook", "ftp://hooks.example.com/hooksecret42"}, {"--overload-storm-threshold", "0"},
		{"--admin-console", "everywhere"}, {"--admin-console", "private"},
	} {
		_, err := parse(t, nil, bad...)
		require.Error(t, err, "%v", bad)
		require.Contains(t, err.Error(), strings.TrimPrefix(bad[0], "--"), "%v", bad)
		require.NotContains(t, err.Error(), "hooksecret42")
	}
	_, err = parse(t, nil, "--admin-console", "private", "--metrics-listen", "127.0.0.1:9100")
	require.NoError(t, err)
}
