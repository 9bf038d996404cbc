package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
)

// requestOrder and walkOrder are the rows of the table, in order.
var (
	requestOrder = []struct{ key, label string }{
		{"createAccount", "createAccount"},
		{"createSession", "createSession"},
		{"refreshSession", "refreshSession"},
		{"createRecord", "createRecord, 1 client"},
		{"createRecord16", "createRecord, 16 clients"},
		{"getRecord", "getRecord"},
		{"listRecords", "listRecords (50)"},
		{"getRepoMedian", "getRepo, median account (21 records)"},
		{"getRepoLargestCached", "getRepo, largest account, from the CAR cache"},
		{"resolveHandle", "resolveHandle"},
		{"getPreferences", "getPreferences"},
	}
	walkOrder = []struct{ key, label string }{
		{"getRepoLargest", "getRepo, largest account, export"},
		{"listRepos", "listRepos, full walk"},
		{"backfill", "subscribeRepos backfill, one reader"},
		{"coldStart", "relay cold start: listRepos + getRepo of every account"},
		{"startup", "start-up (to the first healthy answer)"},
		{"shutdown", "shutdown (SIGTERM to exit)"},
		{"migrate", "bulwark migrate up (nothing to apply)"},
		{"prune", "retention pruning"},
		{"backup", "bulwark backup"},
	}
)

// printCurveTable prints rs (sorted by accounts) as markdown tables.
func printCurveTable(w io.Writer, rs []*curveResult) error {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Accounts < rs[j].Accounts })
	head := "| per request: p50 / p99 ms |"
	sep := "|---|"
	for _, r := range rs {
		head += " " + column(r, rs) + " |"
		sep += "---|"
	}
	if len(rs) > 1 {
		head += " p99 ratio |"
		sep += "---|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, sep)
	for _, row := range requestOrder {
		line := "| " + row.label + " |"
		for _, r := range rs {
			f := r.Requests[row.key]
			if f == nil || f.N == 0 {
				line += " – |"
				continue
			}
			line += fmt.Sprintf(" %s / %s", num(f.P50), num(f.P99))
			if f.Errors > 0 {
				line += fmt.Sprintf(" (%d errors)", f.Errors)
			}
			line += " |"
		}
		if len(rs) > 1 {
			line += " " + ratio(baseline(rs, row.key), rs[len(rs)-1].Requests[row.key]) + " |"
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
	head = "| whole server |"
	sep = "|---|"
	for _, r := range rs {
		head += " " + column(r, rs) + " |"
		sep += "---|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, sep)
	for _, row := range walkOrder {
		line := "| " + row.label + " |"
		for _, r := range rs {
			line += " " + walkCell(r.Walks[row.key]) + " |"
		}
		fmt.Fprintln(w, line)
	}
	for _, r := range rs {
		if p := r.Pool; p != nil {
			fmt.Fprintf(w, "\n%s accounts, pool under createRecord at 16 clients: %d connections at most, %.1f checked out on average (peak %d), %.2f acquisitions per request, each held %.2f ms on average; %d acquisitions waited for a connection (%.0f ms in all); Postgres backends running a statement %.1f on average, idle inside a transaction at most %d.\n",
				commas(r.Accounts), p.MaxConns, p.MeanAcquired, p.PeakAcquired, p.AcquiresPerReq, p.HoldMsPerAcq, p.EmptyAcquires, p.EmptyWaitMs, p.PGActiveMean, p.PGIdleInTxMax)
		}
		fmt.Fprintf(w, "%s accounts: %s records, %s events, database %.1f GiB; Postgres buffer hits over the requests %.1f%% (%s blocks read); load average %s before, %s after.\n",
			commas(r.Accounts), commas(int(r.Records)), commas(int(r.Events)), float64(r.DBBytes)/(1<<30), r.CacheHit*100, commas(int(r.BlocksRead)), r.LoadBefore, r.LoadAfter)
		for _, e := range r.Errors {
			fmt.Fprintf(w, "  failed: %s\n", e)
		}
	}
	return nil
}

// column names a row's column: its accounts, and its label when another
// row has as many.
func column(r *curveResult, rs []*curveResult) string {
	for _, o := range rs {
		if o != r && o.Accounts == r.Accounts {
			return fmt.Sprintf("%s accounts (%s)", commas(r.Accounts), r.Label)
		}
	}
	return commas(r.Accounts) + " accounts"
}

// baseline is the smallest size's figures for key: of several rows of that
// size, the one with the lowest p99, so that a ratio against it errs
// against the largest size.
func baseline(rs []*curveResult, key string) *requestFigures {
	var best *requestFigures
	for _, r := range rs {
		if r.Accounts != rs[0].Accounts {
			break
		}
		if f := r.Requests[key]; f != nil && f.N > 0 && (best == nil || f.P99 < best.P99) {
			best = f
		}
	}
	return best
}

func walkCell(f *walkFigures) string {
	if f == nil {
		return "–"
	}
	s := fmt.Sprintf("%s s", num(f.Seconds))
	if f.Rate > 0 {
		s += fmt.Sprintf(", %s/s", commas(int(f.Rate)))
	}
	if f.Bytes > 0 {
		s += fmt.Sprintf(", %.1f MiB", float64(f.Bytes)/(1<<20))
	}
	if f.RSSMax > 0 && f.RSSBefore > 0 {
		s += fmt.Sprintf(", RSS %.0f → %.0f MiB", f.RSSBefore, f.RSSMax)
	} else if f.RSSMax > 0 {
		s += fmt.Sprintf(", RSS %.0f MiB", f.RSSMax)
	}
	if f.Items > 0 && f.Rate == 0 {
		s += fmt.Sprintf(", %s items", commas(int(f.Items)))
	}
	return s
}

func ratio(a, b *requestFigures) string {
	if a == nil || b == nil || a.P99 == 0 || b.N == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", b.P99/a.P99)
}

// num formats a figure with about three significant digits.
func num(v float64) string {
	switch {
	case v >= 100:
		return commas(int(math.Round(v)))
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// commas writes n with thousands separators.
func commas(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + commas(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// runCurveReport is "bulwark-load curve-report": the table of several
// rows, and their plot.
func runCurveReport(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bulwark-load curve-report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	svg := fs.String("svg", "", "write the plot here (SVG)")
	merge := fs.Bool("median", false, "rows of the same size become one: each per-request figure the median of theirs (alternating rounds of each size on a shared machine)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: bulwark-load curve-report [--svg plot.svg] results/*.json\n\nPrints the cost-curve table of the rows bulwark-load curve wrote, and plots them.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var rs []*curveResult
	for _, path := range fs.Args() {
		b, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(stderr, "bulwark-load curve-report:", err)
			return 1
		}
		var r curveResult
		if err := json.Unmarshal(b, &r); err != nil {
			fmt.Fprintf(stderr, "bulwark-load curve-report: %s: %v\n", path, err)
			return 1
		}
		rs = append(rs, &r)
	}
	if len(rs) == 0 {
		fs.Usage()
		return 2
	}
	if *merge {
		rs = medianRows(rs)
	}
	if err := printCurveTable(stdout, rs); err != nil {
		fmt.Fprintln(stderr, "bulwark-load curve-report:", err)
		return 1
	}
	if *svg != "" {
		if err := os.WriteFile(*svg, []byte(plotCurve(rs)), 0o644); err != nil {
			fmt.Fprintln(stderr, "bulwark-load curve-report:", err)
			return 1
		}
	}
	return 0
}

// plotCurve draws two panels: each request's p99 relative to the smallest
// row (the 1.5× goal dashed), and the walks' seconds per 1,000 accounts
// (flat when linear in accounts).
func plotCurve(rs []*curveResult) string {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Accounts < rs[j].Accounts })
	var b strings.Builder
	const w, h, pw, ph, left, top = 1000, 620, 380, 330, 70, 50
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000"}
	var reqSeries []series
	for _, row := range requestOrder {
		base := baseline(rs, row.key)
		if base == nil || base.P99 == 0 {
			continue
		}
		s := series{label: row.label}
		for _, r := range rs {
			if f := r.Requests[row.key]; f != nil && f.N > 0 {
				s.points = append(s.points, [2]float64{float64(r.Accounts), f.P99 / base.P99})
			}
		}
		reqSeries = append(reqSeries, s)
	}
	var walkSeries []series
	for _, key := range []string{"listRepos", "coldStart"} {
		s := series{label: key + " (s per 1,000 accounts)"}
		for _, r := range rs {
			if f := r.Walks[key]; f != nil && r.Accounts > 0 {
				s.points = append(s.points, [2]float64{float64(r.Accounts), f.Seconds / float64(r.Accounts) * 1000})
			}
		}
		walkSeries = append(walkSeries, s)
	}
	panel(&b, left, top, pw, ph, "p99 relative to "+commas(rs[0].Accounts)+" accounts", reqSeries, colors, 1.5)
	panel(&b, left+pw+150, top, pw, ph, "walk time per 1,000 accounts (s)", walkSeries, colors[3:], 0)
	b.WriteString("</svg>\n")
	return b.String()
}

type series struct {
	label  string
	points [][2]float64 // accounts, value
}

// panel draws series on a log-x axis from the smallest to the largest
// account count, y from 0 to the largest value (at least 2 with a goal).
func panel(b *strings.Builder, x0, y0, pw, ph int, title string, ss []series, colors []string, goal float64) {
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), goal*4/3
	for _, s := range ss {
		for _, p := range s.points {
			minX, maxX, maxY = math.Min(minX, p[0]), math.Max(maxX, p[0]), math.Max(maxY, p[1])
		}
	}
	if math.IsInf(minX, 0) || maxX <= minX {
		minX, maxX = 1, 10
	}
	maxY = niceCeil(maxY * 1.05)
	px := func(v float64) float64 {
		return float64(x0) + (math.Log10(v)-math.Log10(minX))/(math.Log10(maxX)-math.Log10(minX))*float64(pw)
	}
	py := func(v float64) float64 { return float64(y0+ph) - v/maxY*float64(ph) }
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", x0, y0-20, title)
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y0, pw, ph)
	for k := 0; k <= 4; k++ {
		v := maxY * float64(k) / 4
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, py(v)+4, num(v))
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x0, x0+pw, py(v), py(v))
	}
	for x := math.Pow(10, math.Ceil(math.Log10(minX))); x <= maxX*1.001; x *= 10 {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(x), y0+ph+16, commas(int(x)))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">accounts</text>`+"\n", x0+pw/2, y0+ph+34)
	if goal > 0 {
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#d00" stroke-dasharray="6,4"/>`+"\n", x0, x0+pw, py(goal), py(goal))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" fill="#d00">%.1f×</text>`+"\n", x0+pw+4, py(goal)+4, goal)
	}
	for i, s := range ss {
		c := colors[i%len(colors)]
		var pts []string
		for _, p := range s.points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1])))
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(p[0]), py(p[1]), c)
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.Join(pts, " "), c)
		fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s">%s</text>`+"\n", x0, y0+ph+52+14*i, c, s.label)
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// medianRows merges the rows of each size: every per-request figure is the
// median of theirs (p50 and p99 each on their own), the walks and other
// figures those of the first row that has them.
func medianRows(rs []*curveResult) []*curveResult {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Accounts < rs[j].Accounts })
	var out []*curveResult
	for i := 0; i < len(rs); {
		j := i
		for j < len(rs) && rs[j].Accounts == rs[i].Accounts {
			j++
		}
		group := rs[i:j]
		m := *group[0]
		m.Label = fmt.Sprintf("median of %d", len(group))
		m.Requests = map[string]*requestFigures{}
		m.Walks = map[string]*walkFigures{}
		var loads []string
		for _, r := range group {
			for k, w := range r.Walks {
				if m.Walks[k] == nil {
					m.Walks[k] = w
				}
			}
			if m.Pool == nil {
				m.Pool = r.Pool
			}
			loads = append(loads, r.LoadBefore)
		}
		m.LoadBefore, m.LoadAfter = strings.Join(loads, "; "), group[len(group)-1].LoadAfter
		for _, row := range requestOrder {
			var p50, p99 []float64
			var f requestFigures
			for _, r := range group {
				if g := r.Requests[row.key]; g != nil && g.N > 0 {
					p50, p99 = append(p50, g.P50), append(p99, g.P99)
					f.N += g.N
					f.Errors += g.Errors
					f.Clients = g.Clients
				}
			}
			if len(p99) > 0 {
				f.P50, f.P99 = median(p50), median(p99)
				m.Requests[row.key] = &f
			}
		}
		out = append(out, &m)
		i = j
	}
	return out
}

func median(v []float64) float64 {
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
