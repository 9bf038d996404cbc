package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/syncbuf"
)

// childEnv makes the test binary, run as a child process, behave as the
// command (TestMain): "main" runs main(), "block" waits for stdin to close.
const childEnv = "BULWARKLOADTEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(inAttackChild) != "" && os.Getenv(childEnv) == "" {
		// Started as an attack child by a test that forgot to say how:
		// running the tests here would start children of its own.
		fmt.Fprintln(os.Stderr, "test binary started as the attack child without "+childEnv)
		os.Exit(3)
	}
	switch os.Getenv(childEnv) {
	case "main":
		main()
	case "block":
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakePDS answers the four scenarios: every other subscribeRepos upgrade
// is refused with 429, accepted ones get one frame; getRepo returns 1 KB;
// createSession and createRecord succeed.
func fakePDS(t *testing.T) *httptest.Server {
	t.Helper()
	var upgrades atomic.Int64
	up := websocket.Upgrader{}
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/com.atproto.sync.subscribeRepos", func(w http.ResponseWriter, r *http.Request) {
		if upgrades.Add(1)%2 == 0 {
			w.Header().Set("Retry-After", "60")
			http.Error(w, `{"error":"RateLimitExceeded"}`, http.StatusTooManyRequests)
			return
		}
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.WriteMessage(websocket.BinaryMessage, []byte("frame"))
		_, _, _ = c.ReadMessage()
	})
	mux.HandleFunc("/xrpc/com.atproto.sync.getRepo", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte("x"), 1024))
	})
	mux.HandleFunc("POST /xrpc/com.atproto.server.createSession", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"did": "did:plc:test", "accessJwt": "token"})
	})
	mux.HandleFunc("POST /xrpc/com.atproto.repo.createRecord", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer token" {
			http.Error(w, "{}", http.StatusUnauthorized)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"uri":"at://did:plc:test/app.bsky.feed.post/1","cid":"x"}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestLoadSmoke runs every scenario briefly against the fake server and
// checks that each recorded the outcomes the server gave.
func TestLoadSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every scenario for a fixed time")
	}
	t.Parallel()
	srv := fakePDS(t)
	var out bytes.Buffer
	o := options{
		url: srv.URL, duration: 300 * time.Millisecond, baseline: 100 * time.Millisecond,
		scenarios: "flood,relays,scrape,write", floodConns: 2, relays: 2, cursor: 0, scrapers: 2,
		did: "did:plc:test", handle: "alice.test", password: "pw", collection: "app.bsky.feed.post",
		interval: 10 * time.Millisecond, pid: os.Getpid(), cooldown: 0,
	}
	err := load(context.Background(), o, &out, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	s := out.String()
	t.Log(s)
	for _, want := range []string{"write (idle)", "write (load)", "flood", "relays", "scrape", "429=", "101=", "frame=", "200=", "server pid"} {
		require.Contains(t, s, want)
	}
}

func TestRunHelp(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"--help"}, io.Discard, &stderr))
	require.Contains(t, stderr.String(), "--scenarios"[1:])
	require.Contains(t, stderr.String(), "attack-nice")
	require.Contains(t, stderr.String(), "honor-retry-after")
	require.Equal(t, 2, run(context.Background(), []string{"--bogus"}, io.Discard, io.Discard))
	require.Equal(t, 2, run(context.Background(), []string{"--attack-nice", "20"}, io.Discard, io.Discard))
	require.Equal(t, 2, run(context.Background(), []string{"--attack-nice", "-1"}, io.Discard, io.Discard))
	require.Equal(t, 0, run(context.Background(), []string{"seed", "--help"}, io.Discard, io.Discard))

	var o options
	fs := newFlagSet(&o, io.Discard)
	require.NoError(t, fs.Parse(nil))
	require.False(t, o.attack.set, "by default everything runs in one process")
	require.NoError(t, fs.Parse([]string{"--attack-nice", "19"}))
	require.Equal(t, attackNice{set: true, nice: 19}, o.attack)
}

func TestParseSourceAddrs(t *testing.T) {
	t.Parallel()
	addrs, err := parseSourceAddrs("127.0.0.2-127.0.0.201")
	require.NoError(t, err)
	require.Len(t, addrs, 200)
	require.Equal(t, netip.MustParseAddr("127.0.0.201"), addrs[199])
	addrs, err = parseSourceAddrs("127.0.0.2, 127.0.0.9")
	require.NoError(t, err)
	require.Len(t, addrs, 2)
	_, err = parseSourceAddrs("127.0.0.9-127.0.0.2")
	require.Error(t, err)
	addrs, err = parseSourceAddrs("")
	require.NoError(t, err)
	require.Empty(t, addrs)
}

func TestReadProc(t *testing.T) {
	t.Parallel()
	cpu, rss, err := readProc(os.Getpid())
	require.NoError(t, err)
	require.GreaterOrEqual(t, cpu, 0.0)
	require.Positive(t, rss)
}

func TestWSURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://127.0.0.1:2583": "ws://127.0.0.1:2583/xrpc/com.atproto.sync.subscribeRepos?cursor=5",
		"https://pds.example/":  "wss://pds.example/xrpc/com.atproto.sync.subscribeRepos?cursor=5",
	} {
		u, err := url.Parse(strings.TrimSuffix(in, "/"))
		require.NoError(t, err)
		require.Equal(t, want, wsURL(u, 5))
	}
}

// TestLoadSmokeAttackChild runs the same load with --attack-nice 19: the
// attack scenarios run in a child process (this test binary, as the
// command) at nice 19 and report back; the summary has the same rows,
// plus what each process cost.
func TestLoadSmokeAttackChild(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every scenario for a fixed time, in a child process")
	}
	t.Parallel()
	srv := fakePDS(t)
	var out bytes.Buffer
	var stderr syncbuf.Buffer
	o := options{
		url: srv.URL, duration: 500 * time.Millisecond, baseline: 100 * time.Millisecond,
		scenarios: "flood,relays,scrape,write", floodConns: 2, relays: 2, cursor: 0, scrapers: 2,
		did: "did:plc:test", handle: "alice.test", password: "pw", collection: "app.bsky.feed.post",
		interval: 10 * time.Millisecond, pid: os.Getpid(), cooldown: 0,
		attack: attackNice{set: true, nice: 19}, selfExe: os.Args[0], childEnv: []string{childEnv + "=main"}, childStderr: &stderr,
	}
	err := load(context.Background(), o, &out, slog.New(slog.DiscardHandler))
	require.NoError(t, err, "child stderr: %s", stderr.String())
	s := out.String()
	t.Log(s)
	for _, want := range []string{"write (idle)", "write (load)", "flood", "relays", "scrape", "429=", "101=", "frame=", "200=", "server pid",
		"attack process (pid", "at nice 19 (all"} {
		require.Contains(t, s, want)
	}
}

// TestStartNicedLowersOnlyTheChild: every thread of the child runs at the
// nice value asked for, and this process's threads keep theirs.
func TestStartNicedLowersOnlyTheChild(t *testing.T) {
	t.Parallel()
	mine, err := threadNice(os.Getpid())
	require.NoError(t, err)
	original := mine[0]
	if original >= 19 {
		t.Skip("this process already runs at nice 19")
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=block")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, startNiced(cmd, 19))
	defer func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	// Once the Go runtime in the child is up, it has several threads.
	var nice []int
	require.Eventually(t, func() bool {
		nice, err = threadNice(cmd.Process.Pid)
		return err == nil && len(nice) >= 3
	}, 10*time.Second, 5*time.Millisecond)
	for _, n := range nice {
		require.Equal(t, 19, n, "child threads: %v", nice)
	}
	// This process's threads kept theirs.
	mine, err = threadNice(os.Getpid())
	require.NoError(t, err)
	for _, n := range mine {
		require.Equal(t, original, n, "this process's threads: %v", mine)
	}
}

func TestAttackArgsRoundTrip(t *testing.T) {
	t.Parallel()
	o := options{
		url: "http://127.0.0.1:1", duration: 90 * time.Second, floodConns: 3, relays: 4, cursor: -1, scrapers: 5,
		sourceAddrs: "127.0.0.2-127.0.0.9", did: "did:plc:x", blobCIDs: "a,b", honorRetryAfter: true,
		handle: "secret-stays-home", password: "pw",
	}
	args := attackArgs(o, []string{"relays", "scrape"})
	require.Equal(t, attackRole, args[0])
	require.NotContains(t, strings.Join(args, " "), "pw")
	var got options
	fs := newFlagSet(&got, io.Discard)
	require.NoError(t, fs.Parse(args[1:]))
	require.Equal(t, o.url, got.url)
	require.Equal(t, o.duration, got.duration)
	require.Equal(t, "relays,scrape", got.scenarios)
	require.Equal(t, o.floodConns, got.floodConns)
	require.Equal(t, o.relays, got.relays)
	require.Equal(t, o.cursor, got.cursor)
	require.Equal(t, o.scrapers, got.scrapers)
	require.Equal(t, o.sourceAddrs, got.sourceAddrs)
	require.Equal(t, o.did, got.did)
	require.Equal(t, o.blobCIDs, got.blobCIDs)
	require.True(t, got.honorRetryAfter)
}

func TestRecorderReportRoundTrip(t *testing.T) {
	t.Parallel()
	r := newRecorder("scrape")
	r.status(200, 30*time.Millisecond, 1000)
	r.status(503, time.Millisecond, 0)
	r.status(503, 2*time.Millisecond, 0)
	r.failure(errors.New("boom"))
	// Wall-clock times: JSON does not carry the monotonic reading.
	r.start, r.end = time.Unix(1000, 0), time.Unix(1010, 0)
	b, err := json.Marshal(r.report("scrape"))
	require.NoError(t, err)
	var rep recorderReport
	require.NoError(t, json.Unmarshal(b, &rep))
	got := newRecorder("scrape")
	got.load(rep)
	var want, have bytes.Buffer
	printSummary(&want, []*recorder{r})
	printSummary(&have, []*recorder{got})
	require.Equal(t, want.String(), have.String())
	require.Contains(t, have.String(), "last error: boom")
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for range 50 {
		d := retryDelay("3", now)
		require.GreaterOrEqual(t, d, 3*time.Second)
		require.LessOrEqual(t, d, 4500*time.Millisecond)
		d = retryDelay("", now)
		require.GreaterOrEqual(t, d, time.Second)
		require.LessOrEqual(t, d, 1500*time.Millisecond)
		d = retryDelay(now.Add(10*time.Second).UTC().Format(http.TimeFormat), now)
		require.GreaterOrEqual(t, d, 9*time.Second)
		require.LessOrEqual(t, d, 15*time.Second)
		require.LessOrEqual(t, retryDelay("86400", now), maxRetryAfter*3/2)
	}
}

// TestHonorRetryAfter: a scraper refused with Retry-After: 1 asks once and
// then waits at least a second (the wait is the test's, and lasts until
// the run ends); an abusive one asks again at once, until the server ends
// the run at its fifth request.
func TestHonorRetryAfter(t *testing.T) {
	t.Parallel()
	// refusing serves 503 with Retry-After: 1 and calls onHit with the
	// number of each request.
	refusing := func(onHit func(n int64)) []string {
		var hits atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			onHit(hits.Add(1))
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"ServiceOverloaded"}`, http.StatusServiceUnavailable)
		}))
		t.Cleanup(srv.Close)
		return []string{srv.URL + "/xrpc/com.atproto.sync.getRepo?did=did:plc:x"}
	}

	t.Run("polite", func(t *testing.T) {
		t.Parallel()
		var hits atomic.Int64
		targets := refusing(func(n int64) { hits.Store(n) })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		waits := make(chan time.Duration, 2)
		rec := newRecorder("scrape")
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			runScrapers(ctx, targets, nil, 2, func(ctx context.Context, d time.Duration) {
				waits <- d
				<-ctx.Done()
			}, rec)
		}()
		for range 2 {
			select {
			case d := <-waits:
				require.GreaterOrEqual(t, d, time.Second)
			case <-time.After(30 * time.Second):
				t.Fatal("a scraper never waited")
			}
		}
		// Both scrapers are waiting, each after its one request.
		require.EqualValues(t, 2, hits.Load())
		cancel()
		<-finished
		require.Equal(t, 2, rec.count("503"))
	})

	t.Run("abusive", func(t *testing.T) {
		t.Parallel()
		// The timeout only guards against a hang: the server ends the run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		targets := refusing(func(n int64) {
			if n == 5 {
				cancel()
			}
		})
		rec := newRecorder("scrape")
		runScrapers(ctx, targets, nil, 2, nil, rec)
		require.NotErrorIs(t, ctx.Err(), context.DeadlineExceeded, "the scrapers stopped asking")
		// Of the first four answers, at most the one the other scraper was
		// reading when the run ended is not recorded.
		require.GreaterOrEqual(t, rec.count("503"), 3)
	})
}

// TestSeed: a new account is created (logging in fails), and the records
// go out in applyWrites batches of at most --batch.
func TestSeed(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var batches []int
	created := false
	mux := http.NewServeMux()
	mux.HandleFunc("POST /xrpc/com.atproto.server.createSession", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !created {
			http.Error(w, `{"error":"AuthenticationRequired"}`, http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"did": "did:plc:seed", "accessJwt": "token"})
	})
	mux.HandleFunc("POST /xrpc/com.atproto.server.createAccount", func(w http.ResponseWriter, r *http.Request) {
		var in map[string]string
		_ = json.NewDecoder(r.Body).Decode(&in)
		if in["handle"] != "big.test" || in["email"] != "big.test@example.com" || in["password"] != "pw" {
			http.Error(w, `{"error":"InvalidRequest"}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		created = true
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"did": "did:plc:seed", "accessJwt": "token"})
	})
	mux.HandleFunc("POST /xrpc/com.atproto.repo.applyWrites", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Repo   string           `json:"repo"`
			Writes []map[string]any `json:"writes"`
		}
		if r.Header.Get("Authorization") != "Bearer token" || json.NewDecoder(r.Body).Decode(&in) != nil || in.Repo != "did:plc:seed" {
			http.Error(w, `{"error":"InvalidRequest"}`, http.StatusBadRequest)
			return
		}
		for _, wr := range in.Writes {
			v, _ := wr["value"].(map[string]any)
			if wr["$type"] != "com.atproto.repo.applyWrites#create" || len(v["text"].(string)) != 60 {
				http.Error(w, `{"error":"InvalidRequest"}`, http.StatusBadRequest)
				return
			}
		}
		mu.Lock()
		batches = append(batches, len(in.Writes))
		mu.Unlock()
		_, _ = w.Write([]byte(`{}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	var out, stderr bytes.Buffer
	code := run(context.Background(), []string{"seed", "--url", srv.URL, "--handle", "big.test", "--password", "pw",
		"--records", "450", "--batch", "200", "--text-bytes", "60"}, &out, &stderr)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	require.Equal(t, "did:plc:seed\n", out.String())
	require.Equal(t, []int{200, 200, 50}, batches)

	// Again: the account exists now, so it logs in; no records.
	out.Reset()
	code = run(context.Background(), []string{"seed", "--url", srv.URL, "--handle", "big.test", "--password", "pw", "--records", "0"}, &out, &stderr)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	require.Equal(t, "did:plc:seed\n", out.String())
	require.Len(t, batches, 3)
	require.Equal(t, 2, run(context.Background(), []string{"seed", "--handle", "x"}, io.Discard, io.Discard))
}
