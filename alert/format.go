package alert

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
)

// Format is the shape of the body an alert is POSTed as.
type Format string

// Formats. FormatAuto picks FormatSlack for a Slack incoming webhook
// (hooks.slack.com), FormatDiscord for a Discord webhook
// (discord.com/api/webhooks/...), and FormatJSON for anything else.
const (
	FormatAuto Format = "auto"
	// FormatJSON is the Alert itself, for a receiver of the operator's.
	FormatJSON Format = "json"
	// FormatSlack is a Slack incoming webhook's message: {"text": ...}.
	FormatSlack Format = "slack"
	// FormatDiscord is a Discord webhook's message: {"content": ...},
	// mentions off.
	FormatDiscord Format = "discord"
)

// ParseFormat reads a format's name; "" is FormatAuto.
func ParseFormat(s string) (Format, error) {
	switch f := Format(strings.ToLower(strings.TrimSpace(s))); f {
	case "":
		return FormatAuto, nil
	case FormatAuto, FormatJSON, FormatSlack, FormatDiscord:
		return f, nil
	}
	return "", fmt.Errorf("alert format %.40q: want auto, json, slack or discord", s)
}

// ResolveFormat is f, or for FormatAuto (or "") the format rawURL's
// service takes.
func ResolveFormat(f Format, rawURL string) Format {
	if f != FormatAuto && f != "" {
		return f
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return FormatJSON
	}
	host := strings.ToLower(u.Hostname())
	switch {
	case host == "hooks.slack.com":
		return FormatSlack
	case (host == "discord.com" || host == "discordapp.com" || strings.HasSuffix(host, ".discord.com")) && strings.HasPrefix(u.Path, "/api/webhooks/"):
		return FormatDiscord
	}
	return FormatJSON
}

// discordMaxContent is the longest message content Discord accepts.
const discordMaxContent = 2000

// slackMaxText bounds a Slack message's text (Slack truncates past
// 40,000 characters; a page of text is plenty).
const slackMaxText = 3000

// chatText is an alert as a few lines for a chat message: what, where and
// when, the summary (which names the repair, where there is one), and
// the details, shortened to fit.
func chatText(a Alert, details []byte, max int) string {
	head := fmt.Sprintf("%s %s on %s", severityMark(a.Severity), a.Kind, a.Host)
	if a.Subject != "" {
		head += ": " + a.Subject
	}
	text := head + "\n" + a.Summary + "\n" + a.Time.UTC().Format("2006-01-02 15:04:05 UTC")
	if len(details) > 0 && len(details) <= max-len(text)-10 {
		text += "\n```\n" + string(details) + "\n```"
	}
	return cut(text, max)
}

func severityMark(s Severity) string {
	switch s {
	case SeverityCritical:
		return "[CRITICAL]"
	case SeverityInfo:
		return "[info]"
	}
	return "[warning]"
}

// slackEscape escapes what Slack reads as markup in message text (&, <
// and >), so that a consumer's user agent or a relay's answer quoted in
// an alert cannot mention a channel (<!channel>) or make a link.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// encodeAs marshals a in format f (FormatJSON: the Alert itself).
func encodeAs(f Format, a Alert) ([]byte, error) {
	if f == FormatJSON || f == FormatAuto || f == "" {
		return encode(a)
	}
	var details []byte
	if a.Details != nil {
		if d, err := json.MarshalIndent(a.Details, "", " "); err == nil {
			details = d
		}
	}
	switch f {
	case FormatSlack:
		return json.Marshal(map[string]any{"text": slackEscape(chatText(a, details, slackMaxText))})
	case FormatDiscord:
		// Mentions off: a quoted user agent saying @everyone pings no one.
		return json.Marshal(map[string]any{
			"content":          chatText(a, details, discordMaxContent),
			"username":         "Bulwark",
			"allowed_mentions": map[string]any{"parse": []string{}},
		})
	}
	return nil, fmt.Errorf("alert: unknown format %q", f)
}
