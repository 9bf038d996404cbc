// Command bulwark-load replays the incidents that took other PDSes down,
// against any PDS URL, and prints what the server made of them:
//
//   - flood: an upgrade flood on com.atproto.sync.subscribeRepos from one
//     client (how many 429s per second, and how fast a refusal is);
//   - relays: N "relays" that connect at a cursor, read one frame, drop,
//     and reconnect with no backoff;
//   - scrape: a fleet of getRepo (and getBlob) scrapers, M concurrent
//     requests from each of many source addresses (127.0.0.2-127.0.0.254
//     need no setup on Linux);
//   - write: one account writing records with createRecord, measuring p50
//     and p99 first alone (--baseline) and then under all of the above.
//
// With --pid it samples the server's CPU and RSS from /proc, including a
// cooldown after the load stops, to show memory returning to baseline.
//
// With --attack-nice N the attack scenarios (flood, relays, scrape) run in
// a child process (this binary again) at nice N, while the writer and the
// sampler stay here at normal priority: on a one-machine test the load
// generator must not take the CPU that a remote fleet of scrapers would
// not take from the server. --honor-retry-after makes the scrapers wait
// as a well-behaved client would on 429 and 503; by default they retry at
// once, as the abusive ones did.
//
// "bulwark-load seed" creates an account (or logs in to it) and writes
// records to it with applyWrites: the repository the scrapers fetch.
//
// "bulwark-load logins" signs N people in at the same moment, each to an
// account of their own, and prints the answers and latencies: a burst of
// real sign-ins against the password hash queue.
//
//	bulwark-load --url http://127.0.0.1:2583 --duration 2m \
//	  --did did:plc:... --source-addrs 127.0.0.2-127.0.0.201 --scrapers 8 \
//	  --relays 9 --flood-conns 32 --handle alice.test --password hunter2 \
//	  --pid $(pidof bulwark)
//
// Every flag has a BULWARK_LOAD_* environment variable (--url is
// BULWARK_LOAD_URL).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the parsed flags.
type options struct {
	url         string
	duration    time.Duration
	baseline    time.Duration
	cooldown    time.Duration
	scenarios   string
	floodConns  int
	relays      int
	cursor      int64
	scrapers    int
	sourceAddrs string
	did         string
	blobCIDs    string
	handle      string
	password    string
	collection  string
	interval    time.Duration
	pid         int
	// attack, when set (--attack-nice), runs flood, relays and scrape in
	// a child process at nice attack.nice; unset (the zero value), all
	// runs in this process.
	attack          attackNice
	honorRetryAfter bool

	// Not flags: how the attack child is started (tests replace the
	// executable, and add to the environment), and where its log goes.
	selfExe     string
	childEnv    []string
	childStderr io.Writer
}

// parseFlags applies the BULWARK_LOAD_* defaults to fs and parses args:
// when ok is false the command ends with code (0 after -h, 2 for a bad
// flag or variable, which fs or this reports on stderr as name).
func parseFlags(fs *flag.FlagSet, name string, args []string, stderr io.Writer) (code int, ok bool) {
	if err := envDefault(fs); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 2, false
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// envDefault makes every flag settable as BULWARK_LOAD_<NAME>: flags win,
// the environment supplies defaults.
func envDefault(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := "BULWARK_LOAD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "seed":
			return runSeed(ctx, args[1:], stdout, stderr)
		case "logins":
			return runLogins(ctx, args[1:], stdout, stderr)
		case "populate":
			return runPopulate(ctx, args[1:], stdout, stderr)
		case "curve":
			return runCurve(ctx, args[1:], stdout, stderr)
		case "curve-report":
			return runCurveReport(args[1:], stdout, stderr)
		case attackRole:
			return runAttackChild(ctx, args[1:], stdout, stderr)
		}
	}
	var o options
	fs := newFlagSet(&o, stderr)
	if code, ok := parseFlags(fs, "bulwark-load", args, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bulwark-load: unexpected arguments %q\n", fs.Args())
		return 2
	}
	o.childStderr = stderr
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if err := load(ctx, o, stdout, logger); err != nil {
		fmt.Fprintln(stderr, "bulwark-load:", err)
		return 1
	}
	return 0
}

// newFlagSet declares the load flags into o. The attack child parses the
// same set, so that it reads its share of them the same way.
func newFlagSet(o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bulwark-load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.url, "url", "http://127.0.0.1:2583", "base URL of the PDS under test")
	fs.DurationVar(&o.duration, "duration", 2*time.Minute, "how long to apply the load")
	fs.DurationVar(&o.baseline, "baseline", 20*time.Second, "run the writer alone this long first, for the idle p99 (0 = skip)")
	fs.DurationVar(&o.cooldown, "cooldown", 30*time.Second, "with --pid, keep sampling the server this long after the load stops")
	fs.StringVar(&o.scenarios, "scenarios", "flood,relays,scrape,write", "comma-separated scenarios to run (scrape needs --did, write needs --handle and --password)")
	fs.IntVar(&o.floodConns, "flood-conns", 32, "flood: concurrent connections opening subscribeRepos back to back")
	fs.IntVar(&o.relays, "relays", 9, "relays: reconnecting subscribers")
	fs.Int64Var(&o.cursor, "cursor", 0, "relays: cursor to connect at (-1 = none, live only)")
	fs.IntVar(&o.scrapers, "scrapers", 8, "scrape: concurrent requests per source address")
	fs.StringVar(&o.sourceAddrs, "source-addrs", "", "scrape: source addresses, a range 127.0.0.2-127.0.0.201 or a list (empty = default)")
	fs.StringVar(&o.did, "did", "", "scrape: DID of the repo to fetch with getRepo")
	fs.StringVar(&o.blobCIDs, "blob-cids", "", "scrape: comma-separated blob CIDs of --did to fetch with getBlob as well")
	fs.StringVar(&o.handle, "handle", "", "write: account handle or DID for createSession")
	fs.StringVar(&o.password, "password", "", "write: account password (or app password)")
	fs.StringVar(&o.collection, "collection", "app.bsky.feed.post", "write: collection of the records written")
	fs.DurationVar(&o.interval, "write-interval", 100*time.Millisecond, "write: time between writes (0 = back to back)")
	fs.IntVar(&o.pid, "pid", 0, "sample this server process's CPU and RSS from /proc")
	fs.Var(&o.attack, "attack-nice", "run flood, relays and scrape in a child process at this nice value (0-19; 19 = lowest priority), the writer and sampler staying here at normal priority (default: all in this process)")
	fs.BoolVar(&o.honorRetryAfter, "honor-retry-after", false, "scrape: wait Retry-After (plus up to half again, at random) after a 429 or 503, as a well-behaved client would; default: retry at once, as abusive scrapers do")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `bulwark-load replays abuse incidents against a PDS and prints the server's answers.

Usage:
  bulwark-load [flags]

Scenarios: flood (subscribeRepos upgrade flood from one client), relays
(connect at a cursor, read one frame, drop, reconnect without backoff),
scrape (getRepo/getBlob fleet from many source addresses), write
(createRecord p50/p99, idle first, then under load).

  bulwark-load seed [flags]   create an account and write records to it
                              ("bulwark-load seed -h" for its flags)
  bulwark-load logins [flags] sign N people in at once, each to their own
                              account ("bulwark-load logins -h")
  bulwark-load populate ...   fill a server's database with many accounts
  bulwark-load curve ...      measure the cost curve of a populated server
  bulwark-load curve-report   table and plot of several curve results

Flags (each also BULWARK_LOAD_<FLAG>, e.g. BULWARK_LOAD_URL):
`)
		fs.PrintDefaults()
	}
	return fs
}

// plan is what options ask for, parsed: the scenarios to run and their
// targets.
type plan struct {
	base     *url.URL
	want     map[string]bool
	sources  []netip.Addr
	blobCIDs []string
}

// attackScenarios are the scenarios --attack-nice moves to the child
// process, in the order they are reported.
var attackScenarios = []string{"flood", "relays", "scrape"}

func parsePlan(o options, logger *slog.Logger) (*plan, error) {
	base, err := url.Parse(strings.TrimSuffix(o.url, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("--url %q: want http(s)://host[:port]", o.url)
	}
	p := &plan{base: base, want: map[string]bool{}}
	for s := range strings.SplitSeq(o.scenarios, ",") {
		switch s = strings.TrimSpace(s); s {
		case "flood", "relays", "scrape", "write":
			p.want[s] = true
		case "":
		default:
			return nil, fmt.Errorf("--scenarios: unknown scenario %q", s)
		}
	}
	if p.want["scrape"] && o.did == "" {
		logger.Warn("scrape scenario skipped: no --did")
		delete(p.want, "scrape")
	}
	if p.want["write"] && (o.handle == "" || o.password == "") {
		logger.Warn("write scenario skipped: no --handle/--password")
		delete(p.want, "write")
	}
	if len(p.want) == 0 {
		return nil, errors.New("nothing to run")
	}
	if p.sources, err = parseSourceAddrs(o.sourceAddrs); err != nil {
		return nil, fmt.Errorf("--source-addrs: %w", err)
	}
	for c := range strings.SplitSeq(o.blobCIDs, ",") {
		if c = strings.TrimSpace(c); c != "" {
			p.blobCIDs = append(p.blobCIDs, c)
		}
	}
	return p, nil
}

// attacks are the wanted attack scenarios.
func (p *plan) attacks() []string {
	var out []string
	for _, name := range attackScenarios {
		if p.want[name] {
			out = append(out, name)
		}
	}
	return out
}

// startAttacks starts the wanted attack scenarios in wg, each recording
// into recs[name], until ctx ends.
func startAttacks(ctx context.Context, wg *sync.WaitGroup, o options, p *plan, recs map[string]*recorder) {
	start := func(name string, f func(context.Context, *recorder)) {
		if !p.want[name] {
			return
		}
		rec := recs[name]
		rec.begin()
		wg.Go(func() {
			f(ctx, rec)
			rec.finish()
		})
	}
	start("flood", func(ctx context.Context, r *recorder) { runFlood(ctx, p.base, o.floodConns, r) })
	start("relays", func(ctx context.Context, r *recorder) { runRelays(ctx, p.base, o.relays, o.cursor, r) })
	start("scrape", func(ctx context.Context, r *recorder) {
		var wait func(context.Context, time.Duration)
		if o.honorRetryAfter {
			wait = sleep
		}
		runScrapers(ctx, scrapeTargets(p.base, o.did, p.blobCIDs), p.sources, o.scrapers, wait, r)
	})
}

// load runs the plan o asks for against the server and prints the
// summary to stdout: the write baseline alone (--baseline), then every
// scenario together for --duration, then the cooldown (--cooldown, with
// --pid). It returns the attack child's error, if it had one.
func load(ctx context.Context, o options, stdout io.Writer, logger *slog.Logger) error {
	p, err := parsePlan(o, logger)
	if err != nil {
		return err
	}
	r := &loadRun{o: o, p: p, logger: logger, idle: newRecorder("write (idle)")}
	if o.pid > 0 {
		r.sampler = newProcSampler(o.pid)
		if _, _, err := readProc(o.pid); err != nil {
			return fmt.Errorf("--pid %d: %w", o.pid, err)
		}
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go r.sampler.run(sctx)
	}
	if p.want["write"] {
		if err := r.baseline(ctx); err != nil {
			return err
		}
	}
	r.recs = map[string]*recorder{
		"flood":  newRecorder("flood"),
		"relays": newRecorder("relays"),
		"scrape": newRecorder("scrape"),
		"write":  newRecorder("write (load)"),
	}
	res, err := r.loadPhase(ctx)
	if err != nil {
		return err
	}
	if r.sampler != nil && o.cooldown > 0 && !res.interrupted {
		r.setPhase("cooldown")
		select {
		case <-ctx.Done():
		case <-time.After(o.cooldown):
		}
		r.sampler.sample()
	}
	r.print(stdout, res)
	return res.childErr
}

// loadRun is one run of load: the plan, and where it records what the
// server answered.
type loadRun struct {
	o       options
	p       *plan
	logger  *slog.Logger
	sampler *procSampler // nil without --pid
	w       *writer      // nil without the write scenario
	idle    *recorder    // the writer alone, before the load
	recs    map[string]*recorder
}

// loadResult is what the load phase leaves for the report.
type loadResult struct {
	selfUse     cpuUse        // this process's CPU during the load phase
	split       bool          // the attacks ran in a child process
	report      *attackReport // the child's, when it reported
	childErr    error
	interrupted bool
}

// setPhase logs the start of a phase and marks it in the sampler.
func (r *loadRun) setPhase(name string) {
	r.logger.Info("phase", "name", name)
	if r.sampler != nil {
		r.sampler.setPhase(name)
	}
}

// baseline logs the writer in and, with --baseline, measures its writes
// alone, before any load.
func (r *loadRun) baseline(ctx context.Context) error {
	o := r.o
	r.w = &writer{
		client:     &http.Client{Timeout: 30 * time.Second},
		base:       r.p.base,
		handle:     o.handle,
		password:   o.password,
		collection: o.collection,
	}
	if err := r.w.login(ctx); err != nil {
		return fmt.Errorf("log in as %s: %w", o.handle, err)
	}
	r.logger.Info("logged in", "did", r.w.did)
	if o.baseline > 0 {
		r.setPhase("idle")
		bctx, cancel := context.WithTimeout(ctx, o.baseline)
		r.idle.begin()
		r.w.run(bctx, o.interval, r.idle)
		r.idle.finish()
		cancel()
	}
	return nil
}

// loadPhase runs every wanted scenario for --duration, the attacks here
// or in the --attack-nice child, and collects the child's report.
func (r *loadRun) loadPhase(ctx context.Context) (loadResult, error) {
	o, p, recs := r.o, r.p, r.recs
	var res loadResult
	r.setPhase("load")
	selfCPU := cpuClock()
	lctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	var child *attackChild
	if attacks := p.attacks(); o.attack.set && len(attacks) > 0 {
		// The child runs for --duration on its own clock; it is stopped
		// early (with its report) only if this process is interrupted.
		var err error
		child, err = startAttackChild(ctx, o, attacks, r.logger)
		if err != nil {
			return res, fmt.Errorf("start the attack process: %w", err)
		}
	} else {
		startAttacks(lctx, &wg, o, p, recs)
	}
	if p.want["write"] {
		rec := recs["write"]
		rec.begin()
		wg.Go(func() {
			r.w.run(lctx, o.interval, rec)
			rec.finish()
		})
	}
	go progress(lctx, r.logger, recs)
	wg.Wait()
	if child != nil {
		res.split = true
		res.report, res.childErr = child.wait()
		if res.childErr != nil {
			r.logger.Error("attack process failed; its scenarios are missing from the report", "error", res.childErr)
		} else {
			for _, rr := range res.report.Recorders {
				if rec := recs[rr.Key]; rec != nil {
					rec.load(rr)
				}
			}
		}
	}
	res.selfUse = selfCPU.since()
	res.interrupted = ctx.Err() != nil || (res.report != nil && res.report.Interrupted)
	if r.sampler != nil {
		r.sampler.sample() // the end of the load phase
	}
	return res, nil
}

// print writes the summary: every scenario's outcomes, the server's CPU
// and memory by phase (with --pid), what the load tool itself cost, and
// how much slower writes were under load.
func (r *loadRun) print(stdout io.Writer, res loadResult) {
	o, recs := r.o, r.recs
	fmt.Fprintf(stdout, "bulwark-load against %s: %v of load", r.p.base, o.duration)
	if res.interrupted {
		fmt.Fprint(stdout, " (interrupted)")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout)
	printSummary(stdout, []*recorder{r.idle, recs["write"], recs["flood"], recs["relays"], recs["scrape"]})
	if r.sampler != nil {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, r.sampler.summary())
	}
	fmt.Fprintln(stdout)
	printLoadToolCPU(stdout, res.selfUse, res.split, res.report)
	if r.p.want["write"] {
		p99Idle, p99Load := r.idle.ok.quantile(0.99), recs["write"].ok.quantile(0.99)
		if p99Idle > 0 && p99Load > 0 {
			fmt.Fprintf(stdout, "\nwrite p99 under load / idle: %.2fx (the replay aims for at most 3x)\n", float64(p99Load)/float64(p99Idle))
		}
	}
}

// progress logs the running counts every 10 seconds, so that a long run
// shows it is alive and what the server is answering.
func progress(ctx context.Context, logger *slog.Logger, recs map[string]*recorder) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var attrs []any
		for _, name := range []string{"flood", "relays", "scrape", "write"} {
			r := recs[name]
			if r == nil {
				continue
			}
			r.mu.Lock()
			total := 0
			for _, n := range r.outcomes {
				total += n
			}
			r.mu.Unlock()
			if total > 0 {
				attrs = append(attrs, name, strconv.Itoa(total)+" ("+strconv.Itoa(r.count("429")+r.count("503"))+" refused)")
			}
		}
		logger.Info("progress", attrs...)
	}
}
