package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulwark-pds/bulwark/alert"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/outbound"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// serverMetrics registers the collectors of one server's watchers in
// metrics.Registry, replacing those of a server this process ran before
// (the tests run several in turn): the running server's are the ones
// scraped.
var serverMetrics prometheus.Registerer = replacingRegisterer{metrics.Registry}

// watchers are what tell the operator of trouble before users notice: the
// alert webhook, the relay watch and the detector of 503 storms.
type watchers struct {
	alerts   *alert.Webhook
	watch    *relaywatch.Watch // nil: off, or no relay configured
	storm    *alert.StormDetector
	services []service
}

// newAlerts builds the alert webhook (disabled without --alert-webhook).
// The URL is operator configuration; it is still called through the
// guarded outbound client, which may reach it on a private address
// only when it is given as one.
func newAlerts(cfg *config.Config, logger *slog.Logger) (*alert.Webhook, []service, error) {
	format, err := alert.ParseFormat(cfg.AlertWebhookFormat)
	if err != nil {
		return nil, nil, err
	}
	hook, err := alert.New(alert.Config{
		URL: cfg.AlertWebhook, Format: format, Host: cfg.Hostname, Registerer: serverMetrics, Logger: logger,
		Client: operatorClient(cfg, logger, alert.DefaultTimeout),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("alert webhook (--alert-webhook, BULWARK_ALERT_WEBHOOK): %w", err)
	}
	if !hook.Enabled() {
		return hook, nil, nil
	}
	logger.Info("alerts go to a webhook", "host", webhookHost(cfg.AlertWebhook))
	return hook, []service{{name: "alert webhook", run: hook.Run}}, nil
}

// consumerStuckAlert is firehose.HealthConfig.OnStuck: a stuck consumer
// becomes an alert. Its incident is the event it is stuck on, as is that of
// the relay watch's relay_stuck alert for a relay stuck there: one
// incident, one alert, whichever sees it first (consumer health, at once;
// the relay watch, within two checks).
func consumerStuckAlert(hook *alert.Webhook) func(firehose.ConsumerReport) {
	return func(r firehose.ConsumerReport) {
		summary := fmt.Sprintf("firehose consumer %s (%s) keeps reconnecting at cursor %d and cannot get past seq %d",
			r.IP, r.UserAgent, r.Stuck.Cursor, r.Stuck.Seq)
		if ev := r.Stuck.Event; ev != nil {
			summary += fmt.Sprintf(" (#%s, %d bytes", ev.Kind, ev.FrameBytes)
			if len(ev.Problems) > 0 {
				summary += "; " + strings.Join(ev.Problems, "; ")
			}
			summary += ")"
		}
		command := r.Stuck.Command
		if command == "" {
			command = fmt.Sprintf("bulwark admin firehose rewrite-as-sync --seq %d", r.Stuck.Seq)
		}
		summary += "; repair: " + command
		hook.Send(alert.Alert{
			Kind: alert.KindConsumerStuck, Subject: r.IP + " " + r.UserAgent, Incident: alert.StuckIncident(r.Stuck.Seq),
			Severity: alert.SeverityCritical, Summary: summary, Details: r.Stuck,
		})
	}
}

// relayAlerter sends the relay watch's incidents to hook; a stuck relay's
// incident is the event it cannot pass (see consumerStuckAlert).
func relayAlerter(hook *alert.Webhook, mayAlert func() bool) relaywatch.AlerterFunc {
	return func(inc relaywatch.Incident) {
		if !mayAlert() {
			return
		}
		a := alert.Alert{Kind: inc.Kind, Subject: inc.Relay, Severity: alert.Severity(inc.Severity), Summary: inc.Summary, Details: inc.Report}
		if inc.Kind == alert.KindRelayStuck {
			switch rep := inc.Report; {
			case rep.Event != nil:
				a.Incident = alert.StuckIncident(rep.Event.Seq)
			case rep.Seq != nil:
				a.Incident = alert.StuckIncident(*rep.Seq + 1)
			}
		}
		hook.Send(a)
	}
}

// newWatchers builds the relay watch over the relays of --crawlers and
// the 503 storm detector, both alerting through hook. Every node of a
// cluster watches the relays (its console shows them); only the one for
// which mayAlertRelays is true tells the webhook about them, so an
// incident is alerted once, not once per node. Relays seen
// subscribing are not added (relaywatch.Watch.Observe): what a subscriber
// shows of itself, its address and User-Agent, is neither a URL nor to be
// trusted, and the watch calls the URLs it is given.
func newWatchers(cfg *config.Config, log *eventlog.Log, hook *alert.Webhook, mayAlertRelays func() bool, logger *slog.Logger) (*watchers, error) {
	w := &watchers{alerts: hook}
	w.storm = alert.NewStormDetector(alert.StormConfig{
		Threshold: cfg.OverloadStormThreshold,
		OnStorm: func(s alert.Storm) {
			logger.Warn("storm of 503 refusals: the in-flight budget is full; clients are being turned away",
				"refusals", s.Refusals, "window", time.Duration(s.WindowSeconds)*time.Second, "threshold", s.Threshold)
			hook.Send(alert.Alert{
				Kind: alert.KindOverloadStorm, Subject: cfg.Hostname, Severity: alert.SeverityWarning, Details: s,
				Summary: fmt.Sprintf("%d requests refused with 503 within %ds (threshold %d): the in-flight budget is full", s.Refusals, s.WindowSeconds, s.Threshold),
			})
		},
	})
	if cfg.RelayWatchInterval <= 0 || len(cfg.Crawlers) == 0 {
		logger.Info("relay watch off", "interval", cfg.RelayWatchInterval, "relays", len(cfg.Crawlers))
		return w, nil
	}
	head, events := console.WatchSources(log)
	watch, err := relaywatch.New(relaywatch.Config{
		Hostname: cfg.Hostname, Relays: cfg.Crawlers, Head: head, Events: events,
		Alerter:  relayAlerter(hook, mayAlertRelays),
		Client:   operatorClient(cfg, logger, cfg.RelayWatchTimeout),
		Interval: cfg.RelayWatchInterval, Timeout: cfg.RelayWatchTimeout,
		BehindEvents: int64(cfg.RelayBehindEvents), BehindFor: cfg.RelayBehindFor, StuckChecks: cfg.RelayStuckChecks,
		StuckFor:   cfg.RelayStuckFor,
		Registerer: serverMetrics, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("relay watch: %w", err)
	}
	w.watch = watch
	w.services = append(w.services, service{name: "relay watch", run: watch.Run})
	logger.Info("relay watch on", "relays", len(cfg.Crawlers), "interval", cfg.RelayWatchInterval)
	return w, nil
}

// operatorClient is the guarded outbound client for endpoints the
// operator configured (relays, the alert webhook): public addresses, plus
// the private ones those settings name literally (an IP address, or
// localhost for loopback) and those --proxy-allow-private allows every
// outbound request, so that a relay or webhook on the operator's own
// network works without opening the client to anything else.
func operatorClient(cfg *config.Config, logger *slog.Logger, timeout time.Duration) *http.Client {
	urls := append([]string{cfg.AlertWebhook}, cfg.Crawlers...)
	allow := append(outbound.LiteralHosts(urls), cfg.ProxyAllowPrivate...)
	c := outbound.New(outbound.Config{AllowCIDRs: allow, Timeout: timeout, MaxResponseBytes: 1 << 20, Logger: logger})
	return c.HTTPClient()
}

// webhookHost is the webhook's host, which may be logged (its path and
// query may carry a token).
func webhookHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(u.Host); err == nil {
		return h
	}
	return u.Host
}
