package config

import (
	"net/url"
	"time"

	"github.com/bulwark-pds/bulwark/alert"
)

// Where the operator console is served (AdminConsole).
const (
	ConsolePublic  = "public"
	ConsolePrivate = "private"
	ConsoleOff     = "off"
)

// MaxRelayWatchTimeout is the longest --relay-watch-timeout accepted: a
// relay that takes longer is unreachable for the operator's purposes.
const MaxRelayWatchTimeout = time.Minute

// validateOps checks the settings that watch the server for the operator:
// the relay watch, alerts and the console.
func (c *Config) validateOps() error {
	if c.RelayWatchInterval < 0 {
		return settingError("relay-watch-interval", "must not be negative (0 turns the relay watch off)")
	}
	if c.RelayWatchTimeout <= 0 || c.RelayWatchTimeout > MaxRelayWatchTimeout {
		return settingError("relay-watch-timeout", "must be positive and at most %s", MaxRelayWatchTimeout)
	}
	if c.RelayBehindEvents < 1 {
		return settingError("relay-behind-events", "must be at least 1")
	}
	if c.RelayBehindFor <= 0 {
		return settingError("relay-behind-for", "must be positive")
	}
	if c.RelayStuckChecks < 1 {
		return settingError("relay-stuck-checks", "must be at least 1")
	}
	if c.RelayStuckFor <= 0 {
		return settingError("relay-stuck-for", "must be positive")
	}
	if c.AlertWebhook != "" {
		// The URL stays out of the message: it may carry a token.
		u, err := url.Parse(c.AlertWebhook)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return settingError("alert-webhook", "must be an absolute http or https URL")
		}
	}
	if _, err := alert.ParseFormat(c.AlertWebhookFormat); err != nil {
		return settingError("alert-webhook-format", "must be auto, json, slack or discord")
	}
	if c.OverloadStormThreshold < 1 {
		return settingError("overload-storm-threshold", "must be at least 1")
	}
	switch c.AdminConsole {
	case ConsolePublic, ConsoleOff:
	case ConsolePrivate:
		if c.MetricsListen == "" {
			return settingError("admin-console", "private needs --metrics-listen, the listener it is served on")
		}
	default:
		return settingError("admin-console", "must be public, private or off, not %q", c.AdminConsole)
	}
	return nil
}
