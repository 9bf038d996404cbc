package proxy

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are per target service. The service label is bounded: the
// configured services by role, well-known service ids by id, anything a
// header names otherwise as "other" (headers may name any DID).
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	bytes    *prometheus.CounterVec
}

// wellKnownServices are service ids that get their own label.
var wellKnownServices = map[string]bool{
	AppViewServiceID: true,
	LabelerServiceID: true,
	"bsky_chat":      true,
	"bsky_notif":     true,
	"bsky_video":     true,
	"bsky_fg":        true,
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "bulwark", Subsystem: "proxy", Name: "requests_total",
			Help: "Proxied XRPC requests by target service and status answered (499: the client went away).",
		}, []string{"service", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "bulwark", Subsystem: "proxy", Name: "request_duration_seconds",
			Help:    "Proxied request latency by target service, until the response is fully relayed.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"service"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "bulwark", Subsystem: "proxy", Name: "bytes_total",
			Help: "Body bytes relayed by target service and direction (request: to the service; response: from it).",
		}, []string{"service", "direction"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.duration, err = register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.bytes, err = register(reg, m.bytes); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector already registered under
// its name: a second Proxy on the same registry shares the first's.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, err
}

// label is t's bounded service label.
func (p *Proxy) label(t Target) string {
	switch {
	case t.URL == p.cfg.AppViewURL && t.DID == p.cfg.AppViewDID:
		return "appview"
	case t.URL == p.cfg.ModerationURL && t.DID == p.cfg.ModerationDID:
		return "moderation"
	case t.URL == p.cfg.ReportURL && t.DID == p.cfg.ReportDID:
		return "report"
	case wellKnownServices[t.ServiceID]:
		return t.ServiceID
	default:
		return "other"
	}
}

func (m *metrics) observe(service string, status int, elapsed time.Duration, reqBytes, respBytes int64) {
	m.requests.WithLabelValues(service, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(service).Observe(elapsed.Seconds())
	if reqBytes > 0 {
		m.bytes.WithLabelValues(service, "request").Add(float64(reqBytes))
	}
	if respBytes > 0 {
		m.bytes.WithLabelValues(service, "response").Add(float64(respBytes))
	}
}
