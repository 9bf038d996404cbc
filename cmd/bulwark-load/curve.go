package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// curveOptions are the flags of bulwark-load curve.
type curveOptions struct {
	bulwark, dataDir, listen, hostname, handles string
	out, label, password                        string
	scale                                       float64
	coldStart, coldConns                        int
	backfill                                    int
	skip                                        string
}

const curveUsage = `bulwark-load curve measures one row of the cost curve of a populated server
(bulwark-load populate): it runs bulwark migrate, starts bulwark serve on the
data directory, measures every per-request figure over HTTP (createAccount,
createSession, refreshSession, createRecord at 1 and 16 clients, getRecord,
listRecords, getRepo of a median and of the largest account, resolveHandle,
getPreferences), the walks (listRepos, a subscribeRepos backfill, a relay's
cold start: listRepos and getRepo of every account) with the server's memory
during each, start-up, retention pruning and bulwark backup, and writes the
figures as JSON into --out. "bulwark-load curve-report" makes the table and
the plot from the JSON of several sizes.

The server runs with its default settings except: rate limits off (the
figures are costs, not limits), subscribeRepos admission open to loopback
(the walks connect many times), a firehose retention that keeps the
populated history, and a metrics listener on the next port (pool figures).

Usage:
  bulwark-load curve --bulwark ./bulwark --data-dir ./big \
      --listen 127.0.0.1:31901 --hostname localhost:31901 --handle-domains .test \
      --out results --label 1m

Flags (each also BULWARK_LOAD_<FLAG>):
`

func runCurve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o curveOptions
	fs := flag.NewFlagSet("bulwark-load curve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.bulwark, "bulwark", "bulwark", "the bulwark binary to measure")
	fs.StringVar(&o.dataDir, "data-dir", "", "the populated server's data directory (managed Postgres)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:31901", "address the server listens on (the metrics listener takes the next port)")
	fs.StringVar(&o.hostname, "hostname", "", "the server's host name, as populated (default: --listen)")
	fs.StringVar(&o.handles, "handle-domains", ".test", "the handle domain, as populated")
	fs.StringVar(&o.out, "out", "curve-results", "directory the JSON results and the server's log go into")
	fs.StringVar(&o.password, "password", "populate-password", "the populated accounts' password")
	fs.StringVar(&o.label, "label", "", "name of this row (default: the number of accounts)")
	fs.Float64Var(&o.scale, "samples", 1, "multiplies every sample count (0.1 for a quick run)")
	fs.IntVar(&o.coldStart, "cold-start", 0, "relay cold start: getRepo of this many accounts (0 = every account)")
	fs.IntVar(&o.coldConns, "cold-start-conns", 4, "relay cold start: concurrent getRepo requests")
	fs.IntVar(&o.backfill, "backfill", 100_000, "subscribeRepos backfill: events replayed, from the cursor this many events before the last")
	fs.StringVar(&o.skip, "skip", "", "comma-separated steps to leave out: migrate, requests, walks, coldstart, prune, backup")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), curveUsage)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, "bulwark-load curve", args, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 || o.dataDir == "" || o.scale <= 0 {
		fmt.Fprintln(stderr, "bulwark-load curve: want --data-dir, --samples > 0, no arguments")
		return 2
	}
	if o.hostname == "" {
		o.hostname = strings.Replace(o.listen, "127.0.0.1", "localhost", 1)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	res, err := curve(ctx, o, logger)
	if res != nil {
		if werr := writeCurveResult(o, res, stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "bulwark-load curve:", err)
		return 1
	}
	return 0
}

// curveResult is one row of the cost curve.
type curveResult struct {
	Label    string    `json:"label"`
	Accounts int       `json:"accounts"`
	Records  int64     `json:"records"`
	Events   int64     `json:"events"`
	DBBytes  int64     `json:"db_bytes"`
	Started  time.Time `json:"started"`
	// Load is the load average (1, 5, 15 min) before and after the run:
	// the machine is shared.
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after"`
	// Requests are the per-request figures by name.
	Requests map[string]*requestFigures `json:"requests"`
	// Walks are the whole-server operations by name.
	Walks map[string]*walkFigures `json:"walks"`
	// Pool is the server's connection pool under the 16-client writes.
	Pool *poolFigures `json:"pool,omitempty"`
	// CacheHit is the share of Postgres's block reads over the per-request
	// measurements served from its buffers, and BlocksRead those that were
	// not (from the OS page cache or the disk).
	CacheHit   float64 `json:"cache_hit,omitempty"`
	BlocksRead int64   `json:"blocks_read,omitempty"`
	// Errors are steps that failed (the others still ran).
	Errors []string `json:"errors,omitempty"`
}

// requestFigures are one request's latencies.
type requestFigures struct {
	Clients int     `json:"clients"`
	N       int     `json:"n"`
	Errors  int     `json:"errors"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	Rate    float64 `json:"per_s"`
	Note    string  `json:"note,omitempty"`
}

// walkFigures are a whole-server operation's figures.
type walkFigures struct {
	Seconds float64 `json:"seconds"`
	Items   int64   `json:"items,omitempty"`
	Bytes   int64   `json:"bytes,omitempty"`
	Rate    float64 `json:"per_s,omitempty"`
	// RSS of the server before and at most during it (MiB).
	RSSBefore float64 `json:"rss_before_mib,omitempty"`
	RSSMax    float64 `json:"rss_max_mib,omitempty"`
	Note      string  `json:"note,omitempty"`
}

// poolFigures describe the connection pool under load.
type poolFigures struct {
	MaxConns        int     `json:"max_conns"`
	MeanAcquired    float64 `json:"mean_acquired"`
	PeakAcquired    int     `json:"peak_acquired"`
	AcquiresPerReq  float64 `json:"acquires_per_request"`
	HoldMsPerAcq    float64 `json:"hold_ms_per_acquire"`
	EmptyAcquires   int64   `json:"empty_acquires"`
	EmptyWaitMs     float64 `json:"empty_wait_ms"`
	PGActiveMean    float64 `json:"pg_active_mean,omitempty"`
	PGIdleInTxMax   int     `json:"pg_idle_in_tx_max,omitempty"`
	Requests        int     `json:"requests"`
	SamplesAcquired int     `json:"samples"`
}

func (o curveOptions) skipped(step string) bool {
	for _, s := range strings.Split(o.skip, ",") {
		if strings.TrimSpace(s) == step {
			return true
		}
	}
	return false
}

// curve runs the steps; a failed step is recorded and the others run.
func curve(ctx context.Context, o curveOptions, logger *slog.Logger) (*curveResult, error) {
	res := &curveResult{Label: o.label, Started: time.Now().UTC(), LoadBefore: loadAverage(),
		Requests: map[string]*requestFigures{}, Walks: map[string]*walkFigures{}}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	info, err := readServerInfo(ctx, o, logger)
	if err != nil {
		return nil, fmt.Errorf("reading the populated database: %w", err)
	}
	res.Accounts, res.Records, res.Events, res.DBBytes = info.accounts, info.records, info.events, info.dbBytes
	if res.Label == "" {
		res.Label = fmt.Sprint(info.accounts)
	}
	step := func(name string, fn func() error) {
		if o.skipped(name) || ctx.Err() != nil {
			return
		}
		logger.Info("curve step", "step", name)
		if err := fn(); err != nil {
			logger.Error("curve step failed", "step", name, "err", err)
			res.Errors = append(res.Errors, name+": "+err.Error())
		}
	}
	step("migrate", func() error { return measureMigrate(ctx, o, res) })
	srv, err := startServer(ctx, o, res, logger)
	if err != nil {
		return res, err
	}
	m := newMeasurer(o, srv, info, logger)
	step("requests", func() error { return m.requests(ctx, res) })
	step("walks", func() error { return m.walks(ctx, res) })
	step("coldstart", func() error { return m.coldStart(ctx, res) })
	if err := srv.stop(res); err != nil {
		res.Errors = append(res.Errors, "stop: "+err.Error())
	}
	step("prune", func() error { return measurePrune(ctx, o, info, res, logger) })
	step("backup", func() error { return measureBackup(ctx, o, res) })
	res.LoadAfter = loadAverage()
	return res, ctx.Err()
}

// loadAverage is /proc/loadavg's three figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// writeCurveResult writes res as <out>/<label>.json and prints its table.
func writeCurveResult(o curveOptions, res *curveResult, stdout io.Writer) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(o.out, res.Label+".json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "results: %s\n", path)
	return printCurveTable(stdout, []*curveResult{res})
}
