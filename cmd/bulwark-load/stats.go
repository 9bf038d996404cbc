package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"
)

// maxSamples bounds the latencies kept per recorder: past it, reservoir
// sampling keeps a uniform sample, so a long run at high rates has
// constant memory and unbiased percentiles.
const maxSamples = 100_000

// Outcome names that are not HTTP status codes.
const (
	outcomeError   = "error"    // dial, TLS or read failure
	outcomeFrame   = "frame"    // relay read its one frame
	outcomeNoFrame = "no-frame" // relay connected but got no frame in time
)

// recorder accumulates the results of one scenario.
type recorder struct {
	name string

	mu       sync.Mutex
	start    time.Time
	end      time.Time
	outcomes map[string]int
	ok       latencies // successes: 2xx, 101, frames
	refused  latencies // 429 and 503: the server saying no, which must be fast
	bytes    int64
	lastErr  string
}

type latencies struct {
	seen    int
	samples []time.Duration
	max     time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.seen++
	l.max = max(l.max, d)
	if len(l.samples) < maxSamples {
		l.samples = append(l.samples, d)
		return
	}
	if i := rand.IntN(l.seen); i < maxSamples {
		l.samples[i] = d
	}
}

func (l *latencies) quantile(q float64) time.Duration {
	if len(l.samples) == 0 {
		return 0
	}
	s := slices.Clone(l.samples)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func newRecorder(name string) *recorder {
	return &recorder{name: name, outcomes: map[string]int{}}
}

// begin and finish bracket the phase the recorder measures, for rates.
func (r *recorder) begin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.start = time.Now()
}

func (r *recorder) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.end = time.Now()
}

// status records an HTTP outcome: its status code and how long it took.
func (r *recorder) status(code int, d time.Duration, n int64) {
	r.record(strconv.Itoa(code), d, n, code < 400)
}

// failure records a transport error.
func (r *recorder) failure(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes[outcomeError]++
	r.lastErr = err.Error()
}

func (r *recorder) record(outcome string, d time.Duration, n int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes[outcome]++
	r.bytes += n
	switch {
	case outcome == "429" || outcome == "503":
		r.refused.add(d)
	case ok:
		r.ok.add(d)
	}
}

func (r *recorder) count(outcome string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outcomes[outcome]
}

// printSummary writes one row per recorder.
func printSummary(w io.Writer, recs []*recorder) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tattempts\t/s\tok\tok p50\tok p99\tok max\t429\t503\t429+503 /s\trefusal p50\trefusal p99\terrors\tother\tMB\t")
	for _, r := range recs {
		r.mu.Lock()
		total := 0
		for _, n := range r.outcomes {
			total += n
		}
		if total == 0 {
			r.mu.Unlock()
			continue
		}
		secs := r.end.Sub(r.start).Seconds()
		if secs <= 0 {
			secs = time.Since(r.start).Seconds()
		}
		refusals := r.outcomes["429"] + r.outcomes["503"]
		ok := r.ok.seen
		other := total - ok - refusals - r.outcomes[outcomeError]
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%d\t%s\t%s\t%s\t%d\t%d\t%.1f\t%s\t%s\t%d\t%d\t%.1f\t\n",
			r.name, total, float64(total)/secs, ok,
			ms(r.ok.quantile(0.5)), ms(r.ok.quantile(0.99)), ms(r.ok.max),
			r.outcomes["429"], r.outcomes["503"], float64(refusals)/secs,
			ms(r.refused.quantile(0.5)), ms(r.refused.quantile(0.99)),
			r.outcomes[outcomeError], other, float64(r.bytes)/1e6)
		r.mu.Unlock()
	}
	_ = tw.Flush()
	for _, r := range recs {
		r.mu.Lock()
		if len(r.outcomes) > 0 {
			keys := make([]string, 0, len(r.outcomes))
			for k := range r.outcomes {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprintf(w, "%s outcomes:", r.name)
			for _, k := range keys {
				fmt.Fprintf(w, " %s=%d", k, r.outcomes[k])
			}
			if r.lastErr != "" {
				fmt.Fprintf(w, " (last error: %s)", r.lastErr)
			}
			fmt.Fprintln(w)
		}
		r.mu.Unlock()
	}
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + "ms"
}

// recorderReport is a recorder in JSON: how the attack child hands its
// results to the parent (--attack-nice).
type recorderReport struct {
	// Key is the scenario (flood, relays, scrape); Name the row's label.
	Key      string         `json:"key"`
	Name     string         `json:"name"`
	Start    time.Time      `json:"start"`
	End      time.Time      `json:"end"`
	Outcomes map[string]int `json:"outcomes"`
	OK       latencyReport  `json:"ok"`
	Refused  latencyReport  `json:"refused"`
	Bytes    int64          `json:"bytes"`
	LastErr  string         `json:"last_error,omitempty"`
}

type latencyReport struct {
	Seen    int             `json:"seen"`
	Samples []time.Duration `json:"samples"`
	Max     time.Duration   `json:"max"`
}

func (l *latencies) report() latencyReport {
	return latencyReport{Seen: l.seen, Samples: slices.Clone(l.samples), Max: l.max}
}

func (l latencyReport) latencies() latencies {
	return latencies{seen: l.Seen, samples: l.Samples, max: l.Max}
}

// report copies r out, under key.
func (r *recorder) report(key string) recorderReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	outcomes := make(map[string]int, len(r.outcomes))
	for k, v := range r.outcomes {
		outcomes[k] = v
	}
	return recorderReport{
		Key: key, Name: r.name, Start: r.start, End: r.end, Outcomes: outcomes,
		OK: r.ok.report(), Refused: r.refused.report(), Bytes: r.bytes, LastErr: r.lastErr,
	}
}

// load replaces r's results with rep's (the recorder of a scenario that
// ran in the attack child).
func (r *recorder) load(rep recorderReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.start, r.end = rep.Start, rep.End
	r.outcomes = map[string]int{}
	for k, v := range rep.Outcomes {
		r.outcomes[k] = v
	}
	r.ok, r.refused = rep.OK.latencies(), rep.Refused.latencies()
	r.bytes, r.lastErr = rep.Bytes, rep.LastErr
}
