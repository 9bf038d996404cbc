package email

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulwark-pds/bulwark/db"
)

// scrapeTimeout bounds the queue count a scrape runs.
const scrapeTimeout = 2 * time.Second

// metricSet is a Mailer's instrumentation. The counters count what this
// process did; the queue gauge is read from Postgres at scrape time, so
// every node reports the whole cluster's queue.
type metricSet struct {
	sent, failed, retries *prometheus.CounterVec
	queue                 *queueCollector
}

func newMetrics(m *Mailer, reg prometheus.Registerer) (*metricSet, error) {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "bulwark", Subsystem: "email", Name: name, Help: help,
		}, []string{"kind"})
	}
	ms := &metricSet{
		sent:    counter("sent_total", "Mails handed to the SMTP server, by kind."),
		failed:  counter("failed_total", "Mails given up on (last attempt failed or refused for good), by kind."),
		retries: counter("retries_total", "Failed attempts scheduled for a retry, by kind."),
		queue: &queueCollector{m: m, desc: prometheus.NewDesc("bulwark_email_queue_messages",
			"Outbox rows by state (held: no SMTP configured; pending: waiting or being retried).", []string{"state"}, nil)},
	}
	for _, k := range Kinds {
		for _, c := range []*prometheus.CounterVec{ms.sent, ms.failed, ms.retries} {
			c.WithLabelValues(string(k))
		}
	}
	if reg == nil {
		return ms, nil
	}
	for _, c := range []prometheus.Collector{ms.sent, ms.failed, ms.retries, ms.queue} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("email: register metrics: %w", err)
		}
	}
	return ms, nil
}

// queueCollector reports the outbox's rows by state.
type queueCollector struct {
	m    *Mailer
	desc *prometheus.Desc
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.m.QueueDepth(context.Background())
	if err != nil {
		c.m.log.Warn("counting the outbox for metrics", "err", err)
		return
	}
	for _, s := range States {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), s)
	}
}

// QueueDepth counts the outbox's rows by state (every state present).
func (m *Mailer) QueueDepth(ctx context.Context) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	rows, err := m.pool.Query(ctx, qCountByState)
	if err != nil {
		return nil, fmt.Errorf("email: queue depth: %w", db.Translate(err))
	}
	defer rows.Close()
	out := make(map[string]int64, len(States))
	for _, s := range States {
		out[s] = 0
	}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("email: queue depth: %w", db.Translate(err))
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("email: queue depth: %w", db.Translate(err))
	}
	return out, nil
}
