package alert_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/alert"
)

// A Slack incoming webhook gets {"text": ...}: what, where, the summary
// and the details, with Slack's markup characters escaped so that text
// quoted from a client (a user agent) cannot mention a channel.
func TestWebhookSlackMessage(t *testing.T) {
	r := newReceiver(t)
	f := newHook(t, r.URL, alert.Config{Format: alert.FormatSlack})
	a := stuck
	a.Subject = "192.0.2.9 <!channel> evil-agent"
	require.True(t, f.hook.Send(a))
	require.Equal(t, 1, f.hook.Deliver(context.Background()))
	got := <-r.bodies
	require.Len(t, got, 1, "only text: %v", got)
	text := got["text"].(string)
	require.Contains(t, text, "[CRITICAL] relay_stuck on pds.example.com")
	require.Contains(t, text, "relay bsky.network is stuck at seq 41")
	require.Contains(t, text, "bulwark admin firehose rewrite-as-sync --seq 42")
	require.Contains(t, text, "&lt;!channel&gt;")
	require.NotContains(t, text, "<!channel>")
}

// A Discord webhook gets {"content": ...} within Discord's 2,000
// characters, with mentions off.
func TestWebhookDiscordMessage(t *testing.T) {
	r := newReceiver(t)
	f := newHook(t, r.URL, alert.Config{Format: alert.FormatDiscord})
	a := stuck
	a.Subject = "@everyone"
	a.Summary = strings.Repeat("long summary ", 300)
	require.True(t, f.hook.Send(a))
	require.Equal(t, 1, f.hook.Deliver(context.Background()))
	got := <-r.bodies
	content := got["content"].(string)
	require.LessOrEqual(t, len([]rune(content)), 2000)
	require.True(t, strings.HasPrefix(content, "[CRITICAL] relay_stuck on pds.example.com: @everyone"))
	require.Equal(t, map[string]any{"parse": []any{}}, got["allowed_mentions"])
}

// By default the shape follows the URL: Slack's and Discord's webhook
// hosts get theirs, any other URL the alert as JSON.
func TestWebhookFormatFromURL(t *testing.T) {
	for url, want := range map[string]string{
		"https://hooks.slack.com/services/T0/B0/xyz":          "slack",
		"https://discord.com/api/webhooks/1/abc":              "discord",
		"https://discordapp.com/api/webhooks/1/abc":           "discord",
		"https://ptb.discord.com/api/webhooks/1/abc":          "discord",
		"https://discord.com/channels/1":                      "json",
		"https://alerts.example.com/hooks.slack.com/services": "json",
		"http://127.0.0.1:9/hook":                             "json",
	} {
		require.Equal(t, alert.Format(want), alert.ResolveFormat(alert.FormatAuto, url), url)
	}
	for _, f := range []alert.Format{alert.FormatJSON, alert.FormatSlack, alert.FormatDiscord} {
		require.Equal(t, f, alert.ResolveFormat(f, "https://hooks.slack.com/services/x"), "an explicit format stands")
	}
	_, err := alert.ParseFormat("teams")
	require.Error(t, err)
	got, err := alert.ParseFormat("")
	require.NoError(t, err)
	require.Equal(t, alert.FormatAuto, got)
}
