package relaywatch

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the watch's Prometheus series, one set per relay.
type metrics struct {
	lag    *prometheus.GaugeVec
	state  *prometheus.GaugeVec
	checks *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bulwark_relay_seq_lag",
			Help: "Our head seq minus the last seq the relay reported for us (negative: the relay is ahead).",
		}, []string{"relay"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bulwark_relay_state",
			Help: "1 for the relay's current state (healthy, behind, stuck, ahead, throttled, banned, disconnected, unknown, unreachable, pending), 0 for the others.",
		}, []string{"relay", "state"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bulwark_relay_checks_total",
			Help: "getHostStatus calls to the relay by result (ok, host_not_found, error, timeout).",
		}, []string{"relay", "result"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.lag, m.state, m.checks} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, errors.New("relaywatch metrics are already registered: one Watch per registry")
			}
			return nil, err
		}
	}
	return m, nil
}

// setState marks s as the relay's state.
func (m *metrics) setState(relay string, s State) {
	for _, st := range States {
		v := 0.0
		if st == s {
			v = 1
		}
		m.state.WithLabelValues(relay, string(st)).Set(v)
	}
}

func (m *metrics) lagSet(relay string, lag int64) { m.lag.WithLabelValues(relay).Set(float64(lag)) }

func (m *metrics) checked(relay, result string) { m.checks.WithLabelValues(relay, result).Inc() }

// forget drops a relay's series.
func (m *metrics) forget(relay string) {
	l := prometheus.Labels{"relay": relay}
	m.lag.DeletePartialMatch(l)
	m.state.DeletePartialMatch(l)
	m.checks.DeletePartialMatch(l)
}
