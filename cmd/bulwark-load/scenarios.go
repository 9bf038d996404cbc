package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

const subscribeReposPath = "/xrpc/com.atproto.sync.subscribeRepos"

// abortiveDial dials with SO_LINGER 0, so that closing sends RST and
// leaves no TIME_WAIT behind: a flood of short connections from one
// address would otherwise run out of ephemeral ports in under a minute.
func abortiveDial(local net.Addr) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second, LocalAddr: local}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		return c, nil
	}
}

func wsURL(base *url.URL, cursor int64) string {
	u := *base
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	default:
		u.Scheme = "ws"
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + subscribeReposPath
	if cursor >= 0 {
		u.RawQuery = "cursor=" + strconv.FormatInt(cursor, 10)
	}
	return u.String()
}

// dialSubscribe opens one subscribeRepos connection and reports the
// handshake's outcome to rec. It returns the connection on success.
func dialSubscribe(ctx context.Context, d *websocket.Dialer, target string, rec *recorder, okOutcome bool) *websocket.Conn {
	start := time.Now()
	conn, resp, err := d.DialContext(ctx, target, nil)
	elapsed := time.Since(start)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	switch {
	case err == nil:
		if okOutcome {
			rec.status(http.StatusSwitchingProtocols, elapsed, 0)
		}
		return conn
	case ctx.Err() != nil:
		return nil
	case errors.Is(err, websocket.ErrBadHandshake) && resp != nil:
		rec.status(resp.StatusCode, elapsed, 0)
	default:
		rec.failure(err)
	}
	return nil
}

// runFlood is the upgrade flood: conns goroutines from one client open
// subscribeRepos connections back to back and drop them at once. What it
// measures is how quickly the server says no (429 before the upgrade)
// and how many upgrades get through.
func runFlood(ctx context.Context, base *url.URL, conns int, rec *recorder) {
	d := &websocket.Dialer{NetDialContext: abortiveDial(nil), HandshakeTimeout: 10 * time.Second}
	target := wsURL(base, -1)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				if c := dialSubscribe(ctx, d, target, rec, true); c != nil {
					_ = c.Close()
				}
			}
		})
	}
	wg.Wait()
}

// runRelays replays the reconnecting relays: each connects at cursor,
// reads one frame, drops the connection, and reconnects with no backoff.
// A success is a frame read; its latency is connect-to-first-frame.
func runRelays(ctx context.Context, base *url.URL, relays int, cursor int64, rec *recorder) {
	d := &websocket.Dialer{NetDialContext: abortiveDial(nil), HandshakeTimeout: 10 * time.Second}
	target := wsURL(base, cursor)
	var wg sync.WaitGroup
	for range relays {
		wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				c := dialSubscribe(ctx, d, target, rec, false)
				if c == nil {
					continue
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, msg, err := c.ReadMessage()
				_ = c.Close()
				switch {
				case err == nil:
					rec.record(outcomeFrame, time.Since(start), int64(len(msg)), true)
				case ctx.Err() != nil:
				default:
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						rec.record(outcomeNoFrame, time.Since(start), 0, false)
					} else {
						rec.failure(err)
					}
				}
			}
		})
	}
	wg.Wait()
}

// parseSourceAddrs reads "127.0.0.2-127.0.0.201" or a comma-separated
// list. Every 127/8 address is local on Linux, so a fleet of distinct
// client addresses needs no setup.
func parseSourceAddrs(s string) ([]netip.Addr, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []netip.Addr
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if lo, hi, ok := strings.Cut(part, "-"); ok {
			a, err := netip.ParseAddr(lo)
			if err != nil {
				return nil, err
			}
			b, err := netip.ParseAddr(hi)
			if err != nil {
				return nil, err
			}
			if b.Less(a) {
				return nil, fmt.Errorf("source range %q runs backwards", part)
			}
			for ; !b.Less(a); a = a.Next() {
				out = append(out, a)
				if len(out) > 1<<16 {
					return nil, fmt.Errorf("source range %q is too large", part)
				}
			}
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// scrapeTargets are the GET URLs a scraper cycles through.
func scrapeTargets(base *url.URL, did string, blobCIDs []string) []string {
	q := url.Values{"did": {did}}
	targets := []string{base.JoinPath("/xrpc/com.atproto.sync.getRepo").String() + "?" + q.Encode()}
	for _, c := range blobCIDs {
		q := url.Values{"did": {did}, "cid": {c}}
		targets = append(targets, base.JoinPath("/xrpc/com.atproto.sync.getBlob").String()+"?"+q.Encode())
	}
	return targets
}

// runScrapers is the scraper fleet: perSource concurrent GETs from each
// source address (or from the default address when sources is empty),
// cycling through targets, reading every body to the end. With a wait
// (sleep, for --honor-retry-after) a scraper refused with 429 or 503
// calls it with the delay its Retry-After asks for (retryDelay) before
// its next request; with none, it asks again at once.
func runScrapers(ctx context.Context, targets []string, sources []netip.Addr, perSource int, wait func(context.Context, time.Duration), rec *recorder) {
	if len(sources) == 0 {
		sources = []netip.Addr{{}}
	}
	var wg sync.WaitGroup
	for _, src := range sources {
		var local net.Addr
		if src.IsValid() {
			local = &net.TCPAddr{IP: src.AsSlice()}
		}
		client := &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, LocalAddr: local}).DialContext,
			MaxIdleConnsPerHost: perSource,
			DisableCompression:  true,
		}}
		for w := range perSource {
			wg.Go(func() {
				for i := w; ctx.Err() == nil; i++ {
					code, retryAfter := scrapeOnce(ctx, client, targets[i%len(targets)], rec)
					if wait != nil && (code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) {
						wait(ctx, retryDelay(retryAfter, time.Now()))
					}
				}
			})
		}
	}
	wg.Wait()
}

// scrapeOnce fetches target once and records the outcome. It returns the
// status (0 for none) and the response's Retry-After header.
func scrapeOnce(ctx context.Context, client *http.Client, target string, rec *recorder) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		rec.failure(err)
		return 0, ""
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			rec.failure(err)
		}
		return 0, ""
	}
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if err != nil && ctx.Err() == nil {
		rec.failure(err)
		return 0, ""
	}
	if ctx.Err() != nil {
		// Cut off by the end of the run: not a complete response.
		return 0, ""
	}
	rec.status(resp.StatusCode, time.Since(start), n)
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// Retry-After as a well-behaved client reads it.
const (
	// defaultRetryAfter is the wait after a refusal without Retry-After.
	defaultRetryAfter = time.Second
	// maxRetryAfter caps the wait, whatever the server asks.
	maxRetryAfter = 5 * time.Minute
)

// retryDelay is how long a client that honours Retry-After waits: the
// header's seconds (or date), plus up to half again at random so that a
// fleet refused at the same moment does not come back at the same moment.
func retryDelay(header string, now time.Time) time.Duration {
	d := defaultRetryAfter
	if secs, err := strconv.Atoi(strings.TrimSpace(header)); err == nil && secs >= 0 {
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(header); err == nil {
		d = t.Sub(now)
	}
	d = min(max(d, 0), maxRetryAfter)
	return d + rand.N(d/2+1)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// writer is a logged-in account writing records one at a time.
type writer struct {
	client     *http.Client
	base       *url.URL
	handle     string
	password   string
	collection string

	did       string
	accessJWT string
	n         int
}

func (w *writer) xrpc(ctx context.Context, nsid string, token string, in, out any) (int, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base.JoinPath("/xrpc/"+nsid).String(), bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("%s: HTTP %d: %s", nsid, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s: decode response: %w", nsid, err)
		}
	}
	return resp.StatusCode, nil
}

// login calls com.atproto.server.createSession.
func (w *writer) login(ctx context.Context) error {
	var out struct {
		DID       string `json:"did"`
		AccessJWT string `json:"accessJwt"`
	}
	in := map[string]string{"identifier": w.handle, "password": w.password}
	if _, err := w.xrpc(ctx, "com.atproto.server.createSession", "", in, &out); err != nil {
		return err
	}
	if out.DID == "" || out.AccessJWT == "" {
		return errors.New("createSession: response without did or accessJwt")
	}
	w.did, w.accessJWT = out.DID, out.AccessJWT
	return nil
}

// run writes records until ctx ends, one at a time, every interval (or
// back to back when interval is 0), recording createRecord latencies.
func (w *writer) run(ctx context.Context, interval time.Duration, rec *recorder) {
	var tick <-chan time.Time
	if interval > 0 {
		t := time.NewTicker(interval)
		defer t.Stop()
		tick = t.C
	}
	for ctx.Err() == nil {
		w.n++
		in := map[string]any{
			"repo":       w.did,
			"collection": w.collection,
			"record": map[string]any{
				"$type":     w.collection,
				"text":      fmt.Sprintf("bulwark-load write %d", w.n),
				"createdAt": time.Now().UTC().Format(time.RFC3339Nano),
			},
		}
		start := time.Now()
		code, err := w.xrpc(ctx, "com.atproto.repo.createRecord", w.accessJWT, in, nil)
		elapsed := time.Since(start)
		switch {
		case ctx.Err() != nil:
			return
		case code == http.StatusUnauthorized:
			// Access tokens expire (2 h); log in again and carry on.
			rec.status(code, elapsed, 0)
			if err := w.login(ctx); err != nil && ctx.Err() == nil {
				rec.failure(err)
			}
		case code != 0:
			rec.status(code, elapsed, 0)
		default:
			rec.failure(err)
		}
		if tick != nil {
			select {
			case <-ctx.Done():
				return
			case <-tick:
			}
		}
	}
}
