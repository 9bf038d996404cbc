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
	var o options
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
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `bulwark-load replays abuse incidents against a PDS and prints the server's answers.

Usage:
  bulwark-load [flags]

Scenarios: flood (subscribeRepos upgrade flood from one client), relays
(connect at a cursor, read one frame, drop, reconnect without backoff),
scrape (getRepo/getBlob fleet from many source addresses), write
(createRecord p50/p99, idle first, then under load).

Flags (each also BULWARK_LOAD_<FLAG>, e.g. BULWARK_LOAD_URL):
`)
		fs.PrintDefaults()
	}
	if err := envDefault(fs); err != nil {
		fmt.Fprintln(stderr, "bulwark-load:", err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bulwark-load: unexpected arguments %q\n", fs.Args())
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if err := load(ctx, o, stdout, logger); err != nil {
		fmt.Fprintln(stderr, "bulwark-load:", err)
		return 1
	}
	return 0
}

func load(ctx context.Context, o options, stdout io.Writer, logger *slog.Logger) error {
	base, err := url.Parse(strings.TrimSuffix(o.url, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return fmt.Errorf("--url %q: want http(s)://host[:port]", o.url)
	}
	want := map[string]bool{}
	for s := range strings.SplitSeq(o.scenarios, ",") {
		switch s = strings.TrimSpace(s); s {
		case "flood", "relays", "scrape", "write":
			want[s] = true
		case "":
		default:
			return fmt.Errorf("--scenarios: unknown scenario %q", s)
		}
	}
	if want["scrape"] && o.did == "" {
		logger.Warn("scrape scenario skipped: no --did")
		delete(want, "scrape")
	}
	if want["write"] && (o.handle == "" || o.password == "") {
		logger.Warn("write scenario skipped: no --handle/--password")
		delete(want, "write")
	}
	if len(want) == 0 {
		return errors.New("nothing to run")
	}
	sources, err := parseSourceAddrs(o.sourceAddrs)
	if err != nil {
		return fmt.Errorf("--source-addrs: %w", err)
	}
	var blobCIDs []string
	for c := range strings.SplitSeq(o.blobCIDs, ",") {
		if c = strings.TrimSpace(c); c != "" {
			blobCIDs = append(blobCIDs, c)
		}
	}

	var sampler *procSampler
	if o.pid > 0 {
		sampler = newProcSampler(o.pid)
		if _, _, err := readProc(o.pid); err != nil {
			return fmt.Errorf("--pid %d: %w", o.pid, err)
		}
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go sampler.run(sctx)
	}
	setPhase := func(p string) {
		logger.Info("phase", "name", p)
		if sampler != nil {
			sampler.setPhase(p)
		}
	}

	var w *writer
	idle := newRecorder("write (idle)")
	if want["write"] {
		w = &writer{
			client:     &http.Client{Timeout: 30 * time.Second},
			base:       base,
			handle:     o.handle,
			password:   o.password,
			collection: o.collection,
		}
		if err := w.login(ctx); err != nil {
			return fmt.Errorf("log in as %s: %w", o.handle, err)
		}
		logger.Info("logged in", "did", w.did)
		if o.baseline > 0 {
			setPhase("idle")
			bctx, cancel := context.WithTimeout(ctx, o.baseline)
			idle.begin()
			w.run(bctx, o.interval, idle)
			idle.finish()
			cancel()
		}
	}

	recs := map[string]*recorder{
		"flood":  newRecorder("flood"),
		"relays": newRecorder("relays"),
		"scrape": newRecorder("scrape"),
		"write":  newRecorder("write (load)"),
	}
	setPhase("load")
	lctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	start := func(name string, f func(context.Context, *recorder)) {
		if !want[name] {
			return
		}
		rec := recs[name]
		rec.begin()
		wg.Go(func() {
			f(lctx, rec)
			rec.finish()
		})
	}
	start("flood", func(ctx context.Context, r *recorder) { runFlood(ctx, base, o.floodConns, r) })
	start("relays", func(ctx context.Context, r *recorder) { runRelays(ctx, base, o.relays, o.cursor, r) })
	start("scrape", func(ctx context.Context, r *recorder) {
		runScrapers(ctx, scrapeTargets(base, o.did, blobCIDs), sources, o.scrapers, r)
	})
	start("write", func(ctx context.Context, r *recorder) { w.run(ctx, o.interval, r) })
	go progress(lctx, logger, recs)
	wg.Wait()
	interrupted := ctx.Err() != nil
	if sampler != nil {
		sampler.sample() // the end of the load phase
	}

	if sampler != nil && o.cooldown > 0 && !interrupted {
		setPhase("cooldown")
		select {
		case <-ctx.Done():
		case <-time.After(o.cooldown):
		}
		sampler.sample()
	}

	fmt.Fprintf(stdout, "bulwark-load against %s: %v of load", base, o.duration)
	if interrupted {
		fmt.Fprint(stdout, " (interrupted)")
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout)
	printSummary(stdout, []*recorder{idle, recs["write"], recs["flood"], recs["relays"], recs["scrape"]})
	if sampler != nil {
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, sampler.summary())
	}
	if want["write"] {
		p99Idle, p99Load := idle.ok.quantile(0.99), recs["write"].ok.quantile(0.99)
		if p99Idle > 0 && p99Load > 0 {
			fmt.Fprintf(stdout, "\nwrite p99 under load / idle: %.2fx (acceptance: <= 3x)\n", float64(p99Load)/float64(p99Idle))
		}
	}
	return nil
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
