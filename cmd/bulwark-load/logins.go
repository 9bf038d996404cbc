package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"
)

// runLogins is "bulwark-load logins": --concurrency people sign in at the
// same moment, each to an account of their own (<prefix>N.test, created
// first when it does not exist), --rounds times, and the answers and their
// latencies are printed. It measures what a burst of real sign-ins meets:
// the password hash queue, not the per-account and per-address login
// budgets (with --source-addrs each person comes from an address of their
// own).
func runLogins(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var (
		rawURL, prefix, password, invite, sources string
		concurrency, rounds                       int
		pause                                     time.Duration
	)
	fs := flag.NewFlagSet("bulwark-load logins", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&rawURL, "url", "http://127.0.0.1:2583", "base URL of the PDS")
	fs.StringVar(&prefix, "handle-prefix", "login", "accounts are <prefix>1.test ... <prefix>N.test")
	fs.StringVar(&password, "password", "correct horse battery", "their password")
	fs.StringVar(&invite, "invite-code", "", "invite code for new accounts, if the server requires one")
	fs.IntVar(&concurrency, "concurrency", 8, "people signing in at the same moment")
	fs.IntVar(&rounds, "rounds", 5, "bursts, one after another")
	fs.DurationVar(&pause, "pause", time.Second, "time between bursts")
	fs.StringVar(&sources, "source-addrs", "", "source addresses, one per person in turn (a range 127.0.0.2-127.0.0.33 or a list; empty = the default address)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `bulwark-load logins signs --concurrency people in at the same moment, each
to their own account, --rounds times, and prints the answers and latencies.

Usage:
  bulwark-load logins --url http://127.0.0.1:2583 --concurrency 32 --source-addrs 127.0.0.2-127.0.0.33

Flags (each also BULWARK_LOAD_<FLAG>):
`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, "bulwark-load logins", args, stderr); !ok {
		return code
	}
	base, err := url.Parse(strings.TrimSuffix(rawURL, "/"))
	addrs, aerr := parseSourceAddrs(sources)
	switch {
	case fs.NArg() > 0 || concurrency < 1 || rounds < 1:
		fmt.Fprintln(stderr, "bulwark-load logins: want --concurrency >= 1, --rounds >= 1, no arguments")
		return 2
	case err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "":
		fmt.Fprintf(stderr, "bulwark-load logins: --url %q: want http(s)://host[:port]\n", rawURL)
		return 2
	case aerr != nil:
		fmt.Fprintln(stderr, "bulwark-load logins: --source-addrs:", aerr)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	people := make([]*writer, concurrency)
	for i := range people {
		var src netip.Addr
		if len(addrs) > 0 {
			src = addrs[i%len(addrs)]
		}
		handle := fmt.Sprintf("%s%d.test", prefix, i+1)
		people[i] = &writer{client: sourceClient(src), base: base, handle: handle, password: password}
		if err := ensureAccount(ctx, people[i], handle+"@example.com", invite, logger); err != nil {
			fmt.Fprintln(stderr, "bulwark-load logins:", err)
			return 1
		}
	}
	rec := newRecorder(fmt.Sprintf("logins x%d", concurrency))
	rec.begin()
	for r := range rounds {
		if r > 0 {
			sleep(ctx, pause)
		}
		loginBurst(ctx, people, rec)
		if ctx.Err() != nil {
			break
		}
	}
	rec.finish()
	printSummary(stdout, []*recorder{rec})
	return 0
}

// sourceClient is an HTTP client whose connections come from src (any
// address when src is the zero value).
func sourceClient(src netip.Addr) *http.Client {
	var local net.Addr
	if src.IsValid() {
		local = &net.TCPAddr{IP: src.AsSlice()}
	}
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{Timeout: 10 * time.Second, LocalAddr: local}).DialContext,
	}}
}

// loginBurst signs every person in at once: all requests wait at a
// barrier, then go together.
func loginBurst(ctx context.Context, people []*writer, rec *recorder) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range people {
		wg.Go(func() {
			body, _ := json.Marshal(map[string]string{"identifier": w.handle, "password": w.password})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base.JoinPath("/xrpc/com.atproto.server.createSession").String(), bytes.NewReader(body))
			if err != nil {
				rec.failure(err)
				return
			}
			req.Header.Set("Content-Type", "application/json")
			<-start
			t0 := time.Now()
			resp, err := w.client.Do(req)
			if err != nil {
				rec.failure(err)
				return
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			rec.status(resp.StatusCode, time.Since(t0), n)
		})
	}
	close(start)
	wg.Wait()
}
