package firehose_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/repo"
)

// Scenario benchmarks: each iteration runs the whole scenario, so run them
// with -benchtime 1x. Client and server share this process (and its two
// CPUs), so memory figures are upper bounds for the server and latency
// figures include the clients' own scheduling.
//
//	go test ./firehose -run '^$' -bench 'Firehose' -benchtime 1x -timeout 20m

// memInUse is heap plus goroutine stacks in use, after a GC.
func memInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// rawSubscribe opens a subscription with a bare TCP client that does the
// handshake and then only holds the socket: its own memory is a socket and
// nothing else, so the delta measured is the server's.
func rawSubscribe(t testing.TB, wsURL string) net.Conn {
	u, err := url.Parse(wsURL)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", u.RequestURI(), u.Host)
	require.NoError(t, err)
	var resp [4]byte
	var tail []byte
	for !bytes.HasSuffix(tail, []byte("\r\n\r\n")) {
		_, err := io.ReadFull(conn, resp[:1])
		require.NoError(t, err)
		tail = append(tail, resp[0])
	}
	require.True(t, bytes.HasPrefix(tail, []byte("HTTP/1.1 101")), "%s", tail)
	return conn
}

// BenchmarkFirehoseIdleSubscriberMemory measures the server memory of idle
// live subscribers.
func BenchmarkFirehoseIdleSubscriberMemory(b *testing.B) {
	const n = 1000
	for range b.N {
		fb := setup(b, options{hub: firehose.Config{Logger: quietLogger}})
		fb.newRepo(b)
		fb.waitSequenced(b, 1)
		// Warm up: one subscriber and its first frames, so that pools and
		// lazily built state are not counted.
		warm := rawSubscribe(b, fb.wsURL)
		require.Eventually(b, func() bool { return fb.hub.Live() == 1 }, 10*time.Second, time.Millisecond)
		before := memInUse()
		conns := make([]net.Conn, 0, n)
		for range n {
			conns = append(conns, rawSubscribe(b, fb.wsURL))
		}
		require.Eventually(b, func() bool { return fb.hub.Live() == n+1 }, 60*time.Second, 5*time.Millisecond)
		after := memInUse()
		per := float64(after-before) / n
		b.ReportMetric(per, "bytes/subscriber")
		b.Logf("%d idle subscribers: %.0f bytes each (heap+stacks, including the test's client sockets)", n, per)
		for _, c := range conns {
			c.Close()
		}
		warm.Close()
	}
}

// seqOf reads the seq of an event frame without decoding it: the body's
// "seq" key and its unsigned integer.
func seqOf(frame []byte) int64 {
	i := bytes.Index(frame, []byte{0x63, 's', 'e', 'q'})
	if i < 0 || i+4 >= len(frame) {
		return -1
	}
	p := frame[i+4:]
	info := p[0] & 0x1f
	switch {
	case p[0]>>5 != 0:
		return -1
	case info < 24:
		return int64(info)
	case info == 24:
		return int64(p[1])
	case info == 25:
		return int64(p[1])<<8 | int64(p[2])
	case info == 26:
		return int64(p[1])<<24 | int64(p[2])<<16 | int64(p[3])<<8 | int64(p[4])
	}
	var v int64
	for _, c := range p[1:9] {
		v = v<<8 | int64(c)
	}
	return v
}

// fillLog stores n copies of a real #commit (about 1 KB each) as sequenced
// events, straight in SQL, and returns the last seq.
func fillLog(t testing.TB, fb *bundle, n int) int64 {
	t.Helper()
	ctx := context.Background()
	did := fb.newRepo(t)
	fb.write(t, did, strings.Repeat("x", 700))
	last := fb.waitSequenced(t, 2)
	_, err := fb.pool.Exec(ctx, `INSERT INTO events (seq, did, kind, rev, body, seq_offset, blocks_len, ops_count)
		SELECT $1::bigint + g, did, kind, rev, body, seq_offset, blocks_len, ops_count
		FROM events, generate_series(1, $2::bigint) g WHERE seq = $1`, last, n)
	require.NoError(t, err)
	_, err = eventlog.RaiseSeq(ctx, fb.pool, last+int64(n))
	require.NoError(t, err)
	_, err = fb.pool.Exec(ctx, "ANALYZE events")
	require.NoError(t, err)
	return last + int64(n)
}

// BenchmarkFirehoseBackfill100k replays 100,000 events to one reader and
// reports events/s and the peak heap while doing so.
func BenchmarkFirehoseBackfill100k(b *testing.B) {
	const n = 100_000
	for range b.N {
		fb := setup(b, options{hub: firehose.Config{Logger: quietLogger}})
		last := fillLog(b, fb, n)
		var body []byte
		fb.pool.QueryRow(context.Background(), "SELECT body FROM events WHERE seq = $1", last).Scan(&body)

		base := memInUse()
		var peak atomic.Uint64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			var m runtime.MemStats
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		})
		conn, _, err := websocket.DefaultDialer.Dial(fb.wsURL+"?cursor=0", nil)
		require.NoError(b, err)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		allocBefore := ms.TotalAlloc
		start := time.Now()
		var got int
		buf := make([]byte, 64<<10)
		for {
			_, r, err := conn.NextReader()
			require.NoError(b, err)
			k, _ := io.ReadFull(r, buf)
			got++
			if seqOf(buf[:k]) >= last {
				break
			}
		}
		elapsed := time.Since(start)
		runtime.ReadMemStats(&ms)
		allocated := ms.TotalAlloc - allocBefore
		close(stop)
		wg.Wait()
		conn.Close()
		require.GreaterOrEqual(b, got, n)
		b.ReportMetric(float64(got)/elapsed.Seconds(), "events/s")
		b.ReportMetric(float64(allocated)/float64(got), "alloc-B/event")
		b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
		b.Logf("backfill of %d events (%d-byte bodies): %s, %.0f events/s, heap %0.1f MiB before, peak %.1f MiB, %.0f bytes allocated per event",
			got, len(body), elapsed.Round(time.Millisecond), float64(got)/elapsed.Seconds(),
			float64(base)/(1<<20), float64(peak.Load())/(1<<20), float64(allocated)/float64(got))
	}
}

// BenchmarkFirehoseFanout: subs live subscribers while writers commit at
// rate commits/s for dur; every subscriber must receive every commit.
// Reports p50/p99/max from the start of each commit to its arrival at each
// subscriber.
func BenchmarkFirehoseFanout(b *testing.B) {
	const subs, rate, dur = 1000, 200, 10 * time.Second
	for range b.N {
		fb := setup(b, options{hub: firehose.Config{Logger: quietLogger}})
		const repos = 20
		dids := make([]syntax.DID, repos)
		for i := range dids {
			dids[i] = fb.newRepo(b)
		}
		first := fb.waitSequenced(b, repos)

		ctx, cancel := context.WithCancel(context.Background())
		readers := startFanoutReaders(b, ctx, fb, subs, rate*int(dur/time.Second)+10)
		require.Eventually(b, func() bool { return fb.hub.Live() == subs }, 60*time.Second, 10*time.Millisecond)
		started := fanoutWrites(b, fb, dids, time.Second*repos/rate, dur)
		last := fb.waitSequenced(b, first+int64(len(started)))
		readers.waitReached(b, last, 2*time.Minute)
		cancel()
		readers.wg.Wait()

		commitStart := commitStarts(b, fb, first, started)
		lat, incomplete := readers.latencies(commitStart)
		pct := func(p float64) time.Duration { return lat[int(float64(len(lat)-1)*p)] }
		b.ReportMetric(float64(pct(0.5).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
		b.Logf("%d subscribers, %d commits at %d/s: %d deliveries, %d subscribers missing some, %d dropped; commit-to-delivery p50 %s p99 %s max %s",
			subs, len(commitStart), rate, len(lat), incomplete, readers.failures.Load(), pct(0.5), pct(0.99), lat[len(lat)-1])
		require.Zero(b, incomplete, "every subscriber gets every commit")
	}
}

// arrival is one frame's seq and when a reader got it.
type arrival struct {
	seq int64
	at  time.Time
}

// fanoutReaders are live subscribers recording every frame's arrival.
type fanoutReaders struct {
	wg       sync.WaitGroup
	arrivals [][]arrival
	// maxSeen is each reader's highest seq; target is the seq each waits
	// for, and reached[i] is closed once reader i has it.
	maxSeen  []atomic.Int64
	target   atomic.Int64
	reached  []chan struct{}
	failures atomic.Int64
}

// startFanoutReaders subscribes n readers, live, until ctx ends; each
// expects about capacity frames.
func startFanoutReaders(b *testing.B, ctx context.Context, fb *bundle, n, capacity int) *fanoutReaders {
	r := &fanoutReaders{arrivals: make([][]arrival, n), maxSeen: make([]atomic.Int64, n), reached: make([]chan struct{}, n)}
	r.target.Store(math.MaxInt64)
	// Clients read with a larger buffer than gorilla's default so that
	// one read takes several frames: they share the server's CPUs.
	dialer := &websocket.Dialer{ReadBufferSize: 32 << 10}
	for i := range n {
		conn, _, err := dialer.Dial(fb.wsURL, nil)
		require.NoError(b, err)
		r.arrivals[i] = make([]arrival, 0, capacity)
		r.reached[i] = make(chan struct{})
		r.wg.Go(func() { r.read(ctx, i, conn) })
	}
	return r
}

// read records reader i's frames until ctx ends.
func (r *fanoutReaders) read(ctx context.Context, i int, conn *websocket.Conn) {
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	buf := make([]byte, 4096)
	signalled := false
	for {
		_, rd, err := conn.NextReader()
		if err != nil {
			if ctx.Err() == nil {
				r.failures.Add(1)
			}
			return
		}
		k, _ := io.ReadFull(rd, buf)
		s := seqOf(buf[:k])
		r.arrivals[i] = append(r.arrivals[i], arrival{s, time.Now()})
		r.maxSeen[i].Store(s)
		if !signalled && s >= r.target.Load() {
			signalled = true
			close(r.reached[i])
		}
	}
}

// waitReached waits, at most for timeout in all, until every reader has
// seq last. A reader that got there before the target was set is seen by
// its maxSeen; one that gets there after, by its reached channel.
func (r *fanoutReaders) waitReached(b *testing.B, last int64, timeout time.Duration) {
	r.target.Store(last)
	deadline := time.After(timeout)
	for i := range r.reached {
		if r.maxSeen[i].Load() >= last {
			continue
		}
		select {
		case <-r.reached[i]:
		case <-deadline:
			b.Logf("reader %d did not get seq %d in time", i, last)
			return
		}
	}
}

// latencies returns every commit's delivery delay to every reader, sorted,
// and how many readers missed a commit.
func (r *fanoutReaders) latencies(commitStart map[int64]time.Time) ([]time.Duration, int) {
	var lat []time.Duration
	incomplete := 0
	for _, as := range r.arrivals {
		n := 0
		for _, a := range as {
			if t0, ok := commitStart[a.seq]; ok {
				lat = append(lat, a.at.Sub(t0))
				n++
			}
		}
		if n != len(commitStart) {
			incomplete++
		}
	}
	slices.Sort(lat)
	return lat, incomplete
}

// fanoutWrites has each of dids commit every interval for dur and returns
// when each commit started, by "did rev".
func fanoutWrites(b *testing.B, fb *bundle, dids []syntax.DID, interval, dur time.Duration) map[string]time.Time {
	var mu sync.Mutex
	started := map[string]time.Time{}
	var writers sync.WaitGroup
	deadline := time.Now().Add(dur)
	for _, did := range dids {
		writers.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for time.Now().Before(deadline) {
				<-tick.C
				t0 := time.Now()
				res, err := fb.tryWrite(did, "fanout")
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				started[did.String()+" "+res.Rev] = t0
				mu.Unlock()
			}
		})
	}
	writers.Wait()
	return started
}

// commitStarts maps the seq of each #commit after first to when it started.
func commitStarts(b *testing.B, fb *bundle, first int64, started map[string]time.Time) map[int64]time.Time {
	commitStart := map[int64]time.Time{}
	rows, err := fb.pool.Query(context.Background(), "SELECT seq, did || ' ' || rev FROM events WHERE seq > $1 AND kind = 'commit'", first)
	require.NoError(b, err)
	for rows.Next() {
		var s int64
		var key string
		require.NoError(b, rows.Scan(&s, &key))
		commitStart[s] = started[key]
	}
	require.NoError(b, rows.Err())
	return commitStart
}

// BenchmarkFirehoseReconnectLoop replays the incident's load: nine clients
// that connect at the cursor of a 1.9 MB commit, read one frame and drop,
// in a tight loop, while a writer commits 20 times a second. It reports the
// writer's p99 commit latency idle and under the loop, with the default
// admission limits ("admitted" lets every connection in, to measure what
// an accepted connection costs).
func BenchmarkFirehoseReconnectLoop(b *testing.B) {
	const idleFor, loopFor = 20 * time.Second, 60 * time.Second
	for _, mode := range []string{"limited", "admitted"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				adm := firehose.NewAdmission(firehose.AdmissionConfig{})
				if mode == "admitted" {
					adm = firehose.NewAdmission(firehose.AdmissionConfig{Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}})
				}
				fb := setup(b, options{admission: adm, hub: firehose.Config{Logger: quietLogger}})
				big := fb.newRepo(b)
				text := func(c byte) map[string]any {
					return map[string]any{"$type": "app.bsky.feed.post", "text": strings.Repeat(string(c), 950_000), "createdAt": "2026-11-29T00:00:00Z"}
				}
				_, err := fb.engine.Apply(context.Background(), big, []repo.Write{
					{Action: repo.ActionCreate, Collection: "app.bsky.feed.post", Record: text('a')},
					{Action: repo.ActionCreate, Collection: "app.bsky.feed.post", Record: text('b')},
				}, nil)
				require.NoError(b, err)
				bigSeq := fb.waitSequenced(b, 2)
				writer := fb.newRepo(b)

				measure := func(d time.Duration) time.Duration {
					var lat []time.Duration
					tick := time.NewTicker(50 * time.Millisecond)
					defer tick.Stop()
					for end := time.Now().Add(d); time.Now().Before(end); {
						<-tick.C
						t0 := time.Now()
						fb.write(b, writer, "latency probe")
						lat = append(lat, time.Since(t0))
					}
					slices.Sort(lat)
					return lat[len(lat)*99/100]
				}
				idle := measure(idleFor)

				// The nine clients run in a process of their own, as relays
				// would: in this one they would compete with the writer
				// inside Go's scheduler rather than for the machine.
				out := &bytes.Buffer{}
				cmd := exec.Command(os.Args[0], "-test.run=^TestReconnectClientProcess$", "-test.v")
				cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s?cursor=%d", reconnectClientEnv, fb.wsURL, bigSeq-1),
					fmt.Sprintf("%s=%s", reconnectDurationEnv, loopFor))
				cmd.Stdout, cmd.Stderr = out, out
				require.NoError(b, cmd.Start())
				loaded := measure(loopFor)
				require.NoError(b, cmd.Wait(), out.String())
				var conns, frames, refused int64
				for _, line := range strings.Split(out.String(), "\n") {
					if i := strings.Index(line, "reconnect-loop:"); i >= 0 {
						fmt.Sscanf(line[i:], "reconnect-loop: %d connections %d frames %d refused", &conns, &frames, &refused)
					}
				}
				b.ReportMetric(float64(idle.Microseconds())/1000, "idle-p99-ms")
				b.ReportMetric(float64(loaded.Microseconds())/1000, "loop-p99-ms")
				b.Logf("%s: write p99 idle %s, under the reconnect loop %s (%.2fx); %d connections served (%d big frames sent), %d refused",
					mode, idle, loaded, float64(loaded)/float64(idle), conns, frames, refused)
			}
		})
	}
}

const (
	reconnectClientEnv   = "BULWARK_TEST_RECONNECT_URL"
	reconnectDurationEnv = "BULWARK_TEST_RECONNECT_FOR"
)

// TestReconnectClientProcess is the client side of
// BenchmarkFirehoseReconnectLoop, run in a child process; it does nothing
// in a normal test run.
func TestReconnectClientProcess(t *testing.T) {
	u := os.Getenv(reconnectClientEnv)
	if u == "" {
		t.Skip("only run by BenchmarkFirehoseReconnectLoop")
	}
	d, err := time.ParseDuration(os.Getenv(reconnectDurationEnv))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var conns, refused, frames atomic.Int64
	var wg sync.WaitGroup
	for i := range 9 {
		wg.Go(func() {
			h := http.Header{"X-Forwarded-For": {fmt.Sprintf("198.51.100.%d", i+1)}}
			for ctx.Err() == nil {
				c, resp, err := websocket.DefaultDialer.DialContext(ctx, u, h)
				if err != nil {
					if resp != nil {
						resp.Body.Close()
						refused.Add(1)
					}
					continue
				}
				conns.Add(1)
				if _, _, err := c.ReadMessage(); err == nil {
					frames.Add(1)
				}
				c.Close()
			}
		})
	}
	wg.Wait()
	fmt.Printf("reconnect-loop: %d connections %d frames %d refused\n", conns.Load(), frames.Load(), refused.Load())
}
