package console

import (
	"context"
	"html/template"
	"math"
	"net/http"
	"time"

	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// overviewRefresh is how often the overview reloads itself.
const overviewRefresh = 60

// overviewView is the overview page.
type overviewView struct {
	Head          int64
	HeadErr       string
	EventsPerMin  float64
	CommitsPerMin float64
	HasSamples    bool
	Accounts      map[string]int64
	HasAccounts   bool
	Budget        *budgetView
	Refused429    float64
	Refused503    float64
	Relays        []relaywatch.Report
	HasWatch      bool
	Stuck         []firehose.ConsumerReport
	Ahead         []firehose.ConsumerReport
	Consumers     int
	Sparks        []spark
}

type budgetView struct {
	InUse, Capacity  int64
	Queued, MaxQueue int
	Rejected         uint64
	Percent          int
}

type spark struct {
	Label string
	Now   string
	SVG   template.HTML
}

func (c *Console) handleOverview(w http.ResponseWriter, r *http.Request, s session) error {
	ctx := r.Context()
	v := overviewView{HasWatch: c.cfg.Watch != nil}
	if head, err := c.cfg.Log.LastSeq(ctx); err != nil {
		v.HeadErr = err.Error()
	} else {
		v.Head = head
	}
	if c.cfg.Accounts != nil {
		counts, err := c.cfg.Accounts.CountByStatus(ctx)
		if err != nil {
			return err
		}
		v.Accounts, v.HasAccounts = map[string]int64{}, true
		for st, n := range counts {
			v.Accounts[string(st)] = n
		}
	}
	if b := c.cfg.Budget; b != nil {
		st := b.Stats()
		v.Budget = &budgetView{InUse: st.InUse, Capacity: st.Capacity, Queued: st.QueueLen, MaxQueue: st.MaxQueue, Rejected: st.Rejected}
		if st.Capacity > 0 {
			v.Budget.Percent = int(st.InUse * 100 / st.Capacity)
		}
	}
	if c.cfg.Watch != nil {
		v.Relays = c.cfg.Watch.Snapshot()
	}
	if c.cfg.Health != nil {
		all := c.cfg.Health.Consumers()
		v.Consumers = len(all)
		for _, cr := range all {
			if cr.Stuck != nil {
				v.Stuck = append(v.Stuck, cr)
			}
		}
		v.Ahead = aheadConsumers(all)
	}
	c.fillSamples(&v)
	c.render(w, http.StatusOK, "overview", view{Title: "Overview", Nav: "overview", CSRF: c.csrf(s), Refresh: overviewRefresh, Data: v})
	return nil
}

// fillSamples adds the last minute's rates, the last hour's refusals and
// the day's sparklines.
func (c *Console) fillSamples(v *overviewView) {
	if c.cfg.Samples == nil {
		return
	}
	samples := c.cfg.Samples.Samples()
	if len(samples) == 0 {
		return
	}
	v.HasSamples = true
	last := samples[len(samples)-1]
	v.EventsPerMin, v.CommitsPerMin = last.EventsPerMin, last.CommitsPerMin
	hourAgo := last.At.Add(-time.Hour)
	events := make([]float64, len(samples))
	p99 := make([]float64, len(samples))
	refused := make([]float64, len(samples))
	for i, sm := range samples {
		events[i], p99[i], refused[i] = sm.EventsPerMin, sm.WriteP99*1000, sm.Refused429+sm.Refused503
		if sm.At.After(hourAgo) {
			v.Refused429 += sm.Refused429
			v.Refused503 += sm.Refused503
		}
	}
	lastP99 := "no writes"
	if !math.IsNaN(last.WriteP99) {
		lastP99 = (time.Duration(last.WriteP99 * float64(time.Second))).Round(100 * time.Microsecond).String()
	}
	v.Sparks = []spark{
		{Label: "Events per minute, last 24 hours", Now: formatRate(last.EventsPerMin), SVG: sparkline("Events per minute over the last 24 hours", events)},
		{Label: "Write latency p99, last 24 hours", Now: lastP99, SVG: sparkline("Write latency p99 in milliseconds over the last 24 hours", p99)},
		{Label: "Refusals (429 and 503) per minute, last 24 hours", Now: formatRate(last.Refused429 + last.Refused503), SVG: sparkline("Refusals per minute over the last 24 hours", refused)},
	}
}

func formatRate(v float64) string {
	if v >= 100 || v == math.Trunc(v) {
		return formatInt(int64(math.Round(v)))
	}
	return formatFloat(v)
}

// handleCheckRelays asks every relay now instead of at the next interval.
func (c *Console) handleCheckRelays(w http.ResponseWriter, r *http.Request, s session) error {
	if c.cfg.Watch != nil {
		ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
		defer cancel()
		c.cfg.Watch.CheckNow(ctx)
	}
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
	return nil
}
