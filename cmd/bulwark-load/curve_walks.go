package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// rssSampler follows a process's resident set every 50 ms.
type rssSampler struct {
	pid    int
	before int64
	peak   atomic.Int64
	stop   context.CancelFunc
	done   chan struct{}
}

func sampleRSS(ctx context.Context, pid int) *rssSampler {
	_, rss, _ := readProc(pid)
	ctx, cancel := context.WithCancel(ctx)
	s := &rssSampler{pid: pid, before: rss, stop: cancel, done: make(chan struct{})}
	s.peak.Store(rss)
	go func() {
		defer close(s.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, rss, err := readProc(pid); err == nil && rss > s.peak.Load() {
					s.peak.Store(rss)
				}
			}
		}
	}()
	return s
}

// finish stops sampling and fills w's memory figures.
func (s *rssSampler) finish(w *walkFigures) {
	s.stop()
	<-s.done
	w.RSSBefore, w.RSSMax = mb(s.before), mb(s.peak.Load())
}

// walks measures the listRepos walk and the subscribeRepos backfill.
func (m *measurer) walks(ctx context.Context, res *curveResult) error {
	s := sampleRSS(ctx, m.srv.pid)
	start := time.Now()
	n, err := m.listRepos(ctx, func(string) {})
	if err != nil {
		return err
	}
	w := &walkFigures{Seconds: time.Since(start).Seconds(), Items: n}
	w.Rate = float64(n) / w.Seconds
	s.finish(w)
	res.Walks["listRepos"] = w
	return m.backfill(ctx, res)
}

// listRepos walks com.atproto.sync.listRepos a page of 1,000 at a time and
// hands each DID to fn.
func (m *measurer) listRepos(ctx context.Context, fn func(did string)) (int64, error) {
	var n int64
	cursor := ""
	for {
		q := url.Values{"limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Cursor string `json:"cursor"`
			Repos  []struct {
				DID string `json:"did"`
			} `json:"repos"`
		}
		if _, err := m.call(ctx, "com.atproto.sync.listRepos", q, "", nil, &page); err != nil {
			return n, err
		}
		for _, r := range page.Repos {
			fn(r.DID)
		}
		n += int64(len(page.Repos))
		if page.Cursor == "" || len(page.Repos) == 0 {
			return n, nil
		}
		cursor = page.Cursor
	}
}

// seqKey is the "seq" map key of an event body, followed by its value.
var seqKey = []byte{0x63, 's', 'e', 'q'}

// frameSeq reads the seq of a subscribeRepos frame (0: none).
func frameSeq(frame []byte) int64 {
	i := bytes.Index(frame, seqKey)
	if i < 0 || i+5 > len(frame) {
		return 0
	}
	b := frame[i+4:]
	if b[0]>>5 != 0 {
		return 0
	}
	switch n := b[0] & 0x1f; {
	case n < 24:
		return int64(n)
	case n == 24 && len(b) >= 2:
		return int64(b[1])
	case n == 25 && len(b) >= 3:
		return int64(b[1])<<8 | int64(b[2])
	case n == 26 && len(b) >= 5:
		return int64(b[1])<<24 | int64(b[2])<<16 | int64(b[3])<<8 | int64(b[4])
	case n == 27 && len(b) >= 9:
		var v int64
		for _, c := range b[1:9] {
			v = v<<8 | int64(c)
		}
		return v
	}
	return 0
}

// backfill replays the last --backfill events to one reader and reports
// its rate and the server's memory meanwhile.
func (m *measurer) backfill(ctx context.Context, res *curveResult) error {
	from := max(m.info.lastSeq-int64(m.o.backfill), 0)
	u := strings.Replace(m.srv.base, "http://", "ws://", 1) + "/xrpc/com.atproto.sync.subscribeRepos?cursor=" + strconv.FormatInt(from, 10)
	s := sampleRSS(ctx, m.srv.pid)
	start := time.Now()
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, u, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	var frames, bytesRead int64
	for {
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		_, data, err := conn.ReadMessage()
		if err != nil {
			return fmt.Errorf("after %d frames: %w", frames, err)
		}
		frames++
		bytesRead += int64(len(data))
		if frameSeq(data) >= m.info.lastSeq {
			break
		}
	}
	w := &walkFigures{Seconds: time.Since(start).Seconds(), Items: frames, Bytes: bytesRead}
	w.Rate = float64(frames) / w.Seconds
	s.finish(w)
	res.Walks["backfill"] = w
	return nil
}

// coldStart is a relay's first crawl: listRepos, and getRepo of every
// account (or --cold-start of them), with --cold-start-conns at once.
func (m *measurer) coldStart(ctx context.Context, res *curveResult) error {
	s := sampleRSS(ctx, m.srv.pid)
	start := time.Now()
	dids := make(chan string, 1024)
	var fetched, bytesRead, failed atomic.Int64
	var wg sync.WaitGroup
	for range m.o.coldConns {
		wg.Go(func() {
			for did := range dids {
				n, err := m.getRepo(ctx, did)
				if err != nil {
					failed.Add(1)
					continue
				}
				fetched.Add(1)
				bytesRead.Add(n)
			}
		})
	}
	var listed int64
	limit := int64(m.o.coldStart)
	_, err := m.listRepos(ctx, func(did string) {
		if limit > 0 && listed >= limit {
			return
		}
		listed++
		select {
		case dids <- did:
		case <-ctx.Done():
		}
	})
	close(dids)
	wg.Wait()
	if err != nil {
		return err
	}
	w := &walkFigures{Seconds: time.Since(start).Seconds(), Items: fetched.Load(), Bytes: bytesRead.Load()}
	w.Rate = float64(w.Items) / w.Seconds
	if f := failed.Load(); f > 0 {
		w.Note = fmt.Sprintf("%d getRepo failed", f)
	}
	s.finish(w)
	res.Walks["coldStart"] = w
	return nil
}

// getRepo downloads did's repository, discarding it, and returns its size.
func (m *measurer) getRepo(ctx context.Context, did string) (int64, error) {
	return m.call(ctx, "com.atproto.sync.getRepo", url.Values{"did": {did}}, "", nil, nil)
}

// poolSampler reads the server's pool gauges and counters from its
// metrics listener every 50 ms.
type poolSampler struct {
	url                     string
	mu                      sync.Mutex
	samples, peak, maxConns int
	acquiredSum             float64
	first, last             map[string]float64
	firstAt, lastAt         time.Time
}

func newPoolSampler(metricsURL string) *poolSampler {
	return &poolSampler{url: metricsURL + "/metrics"}
}

func (p *poolSampler) run(ctx context.Context) {
	client := &http.Client{Timeout: 5 * time.Second}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		vals, err := scrapePool(ctx, client, p.url)
		if err == nil {
			p.mu.Lock()
			if p.first == nil {
				p.first, p.firstAt = vals, time.Now()
			}
			p.last, p.lastAt = vals, time.Now()
			p.samples++
			a := vals["acquired_conns"]
			p.acquiredSum += a
			p.peak = max(p.peak, int(a))
			p.maxConns = int(vals["max_conns"])
			p.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrapePool reads the bulwark_pg_pool_* figures of one scrape.
func scrapePool(ctx context.Context, client *http.Client, u string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), " ")
		if !ok || !strings.HasPrefix(name, "bulwark_pg_pool_") {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
			out[strings.TrimPrefix(name, "bulwark_pg_pool_")] = v
		}
	}
	return out, sc.Err()
}

// figures sums up the samples: mean and peak connections checked out, and
// by Little's law the mean time a connection is held per acquisition
// (mean checked out over acquisitions per second).
func (p *poolSampler) figures(requests int) *poolFigures {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := &poolFigures{MaxConns: p.maxConns, PeakAcquired: p.peak, Requests: requests, SamplesAcquired: p.samples}
	if p.samples == 0 || p.first == nil {
		return f
	}
	f.MeanAcquired = p.acquiredSum / float64(p.samples)
	acq := p.last["acquires_total"] - p.first["acquires_total"]
	secs := p.lastAt.Sub(p.firstAt).Seconds()
	if acq > 0 && secs > 0 {
		f.HoldMsPerAcq = f.MeanAcquired / (acq / secs) * 1000
		f.AcquiresPerReq = acq / float64(max(requests, 1))
	}
	f.EmptyAcquires = int64(p.last["empty_acquires_total"] - p.first["empty_acquires_total"])
	f.EmptyWaitMs = (p.last["empty_acquire_wait_seconds_total"] - p.first["empty_acquire_wait_seconds_total"]) * 1000
	return f
}
