package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// measurer makes the per-request measurements against the running server.
type measurer struct {
	o      curveOptions
	srv    *server
	info   *serverInfo
	log    *slog.Logger
	client *http.Client
	run    string // prefix of the accounts this run creates
}

func newMeasurer(o curveOptions, srv *server, info *serverInfo, logger *slog.Logger) *measurer {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}
	return &measurer{o: o, srv: srv, info: info, log: logger,
		client: &http.Client{Transport: tr, Timeout: 10 * time.Minute},
		run:    strconv.FormatInt(time.Now().Unix()%1_000_000, 36)}
}

// session is a logged-in account.
type session struct {
	did, access, refresh string
}

// samples scales a sample count by --samples.
func (m *measurer) samples(n int) int { return max(1, int(float64(n)*m.o.scale)) }

// timed runs fn n times from clients goroutines and returns the latencies.
func timed(ctx context.Context, n, clients int, fn func(ctx context.Context, client, i int) error) *requestFigures {
	var next atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				t := time.Now()
				err := fn(ctx, c, i)
				d := time.Since(t)
				mu.Lock()
				if err != nil {
					errs++
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	slices.Sort(lat)
	f := &requestFigures{Clients: clients, N: len(lat), Errors: errs, Rate: float64(len(lat)) / el.Seconds()}
	if len(lat) > 0 {
		q := func(p float64) float64 { return msf(lat[min(int(p*float64(len(lat))), len(lat)-1)]) }
		f.P50, f.P99, f.Max = q(0.5), q(0.99), msf(lat[len(lat)-1])
	}
	return f
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// call makes one XRPC request: a POST of in as JSON when in is not nil,
// else a GET with query. It returns the body's size, decoding it into out
// when out is not nil.
func (m *measurer) call(ctx context.Context, nsid string, query url.Values, token string, in, out any) (int64, error) {
	u := m.srv.base + "/xrpc/" + nsid
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	method, body := http.MethodGet, io.Reader(nil)
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, err
		}
		method, body = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return 0, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("%s: HTTP %d: %s", nsid, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		var buf bytes.Buffer
		n, err := io.Copy(&buf, resp.Body)
		if err != nil {
			return n, err
		}
		return n, json.Unmarshal(buf.Bytes(), out)
	}
	return io.Copy(io.Discard, resp.Body)
}

// login makes a session for handle.
func (m *measurer) login(ctx context.Context, handle string) (*session, error) {
	var out struct {
		DID        string `json:"did"`
		AccessJWT  string `json:"accessJwt"`
		RefreshJWT string `json:"refreshJwt"`
	}
	_, err := m.call(ctx, "com.atproto.server.createSession", nil, "",
		map[string]string{"identifier": handle, "password": m.o.password}, &out)
	if err != nil {
		return nil, err
	}
	return &session{did: out.DID, access: out.AccessJWT, refresh: out.RefreshJWT}, nil
}

func post(i int) map[string]any {
	return map[string]any{
		"$type":     "app.bsky.feed.post",
		"text":      fmt.Sprintf("cost curve post %d: lorem ipsum dolor sit amet, consectetur adipiscing", i),
		"createdAt": time.Now().UTC().Format(time.RFC3339Nano),
	}
}

// requests measures every per-request figure, and how much of Postgres's
// reads its buffers served meanwhile.
func (m *measurer) requests(ctx context.Context, res *curveResult) error {
	hit0, read0, _ := m.blockStats(ctx)
	err := m.measureRequests(ctx, res)
	if hit1, read1, serr := m.blockStats(ctx); serr == nil && hit1+read1 > hit0+read0 {
		res.CacheHit = float64(hit1-hit0) / float64(hit1-hit0+read1-read0)
		res.BlocksRead = read1 - read0
	}
	return err
}

func (m *measurer) measureRequests(ctx context.Context, res *curveResult) error {
	info := m.info
	pick := func(i int) acct { return info.random[i%len(info.random)] }

	res.Requests["createAccount"] = timed(ctx, m.samples(100), 1, func(ctx context.Context, _, i int) error {
		h := fmt.Sprintf("c%s-%d%s", m.run, i, m.o.handles)
		_, err := m.call(ctx, "com.atproto.server.createAccount", nil, "",
			map[string]string{"handle": h, "email": fmt.Sprintf("c%s-%d@example.com", m.run, i), "password": m.o.password}, nil)
		return err
	})
	var sessions []*session
	var smu sync.Mutex
	res.Requests["createSession"] = timed(ctx, m.samples(200), 1, func(ctx context.Context, _, i int) error {
		s, err := m.login(ctx, pick(i).handle)
		if err == nil && len(sessions) < 32 {
			smu.Lock()
			sessions = append(sessions, s)
			smu.Unlock()
		}
		return err
	})
	if len(sessions) == 0 {
		return fmt.Errorf("no session: createSession failed every time")
	}
	res.Requests["refreshSession"] = timed(ctx, m.samples(500), 1, func(ctx context.Context, _, i int) error {
		s := sessions[i%len(sessions)]
		var out struct {
			AccessJWT  string `json:"accessJwt"`
			RefreshJWT string `json:"refreshJwt"`
		}
		_, err := m.call(ctx, "com.atproto.server.refreshSession", nil, s.refresh, struct{}{}, &out)
		if err == nil {
			s.access, s.refresh = out.AccessJWT, out.RefreshJWT
		}
		return err
	})
	res.Requests["getPreferences"] = timed(ctx, m.samples(1000), 1, func(ctx context.Context, _, i int) error {
		_, err := m.call(ctx, "app.bsky.actor.getPreferences", nil, sessions[i%len(sessions)].access, nil, nil)
		return err
	})
	if err := m.writes(ctx, res); err != nil {
		return err
	}
	m.reads(ctx, res, pick)
	return nil
}

// writes measures createRecord from one client, then from 16 clients on
// 16 accounts while sampling the server's connection pool.
func (m *measurer) writes(ctx context.Context, res *curveResult) error {
	var writers []*session
	for _, a := range m.info.writers {
		s, err := m.login(ctx, a.handle)
		if err != nil {
			return fmt.Errorf("logging in writer %s: %w", a.handle, err)
		}
		writers = append(writers, s)
	}
	create := func(ctx context.Context, s *session, i int) error {
		_, err := m.call(ctx, "com.atproto.repo.createRecord", nil, s.access,
			map[string]any{"repo": s.did, "collection": "app.bsky.feed.post", "record": post(i)}, nil)
		return err
	}
	res.Requests["createRecord"] = timed(ctx, m.samples(1000), 1, func(ctx context.Context, _, i int) error {
		return create(ctx, writers[0], i)
	})
	clients := min(16, len(writers)-1)
	pool := newPoolSampler(m.srv.metrics)
	pctx, stop := context.WithCancel(ctx)
	go pool.run(pctx)
	act := make(chan [2]float64, 1)
	go func() { act <- m.sampleActivity(pctx) }()
	f := timed(ctx, m.samples(4000), clients, func(ctx context.Context, c, i int) error {
		return create(ctx, writers[1+c], i)
	})
	stop()
	res.Requests["createRecord16"] = f
	res.Pool = pool.figures(f.N + f.Errors)
	a := <-act
	res.Pool.PGActiveMean, res.Pool.PGIdleInTxMax = a[0], int(a[1])
	return nil
}

// dbPool connects to the server's managed Postgres over its socket (the
// server's own pool is not shared), for the server-side statistics.
func (m *measurer) dbPool(ctx context.Context) (*pgxpool.Pool, error) {
	dir, err := filepath.Abs(filepath.Join(m.o.dataDir, "postgres"))
	if err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/bulwark",
		RawQuery: url.Values{"host": {dir}, "sslmode": {"disable"}, "pool_max_conns": {"1"}}.Encode()}
	return pgxpool.New(ctx, u.String())
}

// blockStats reads the database's buffer hits and reads so far.
func (m *measurer) blockStats(ctx context.Context) (hit, read int64, err error) {
	p, err := m.dbPool(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer p.Close()
	err = p.QueryRow(ctx, qCurveBlockStats).Scan(&hit, &read)
	return hit, read, err
}

// sampleActivity samples the server's backends every 50 ms until ctx
// ends: the mean running a statement, and the most found inside a
// transaction between statements (holding its locks while the server
// does something else).
func (m *measurer) sampleActivity(ctx context.Context) [2]float64 {
	p, err := m.dbPool(context.WithoutCancel(ctx))
	if err != nil {
		return [2]float64{}
	}
	defer p.Close()
	var sum, n, idleMax float64
	for ctx.Err() == nil {
		var active, idleInTx float64
		if err := p.QueryRow(ctx, qCurveActivity).Scan(&active, &idleInTx); err == nil {
			sum += active
			n++
			idleMax = max(idleMax, idleInTx)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n == 0 {
		return [2]float64{}
	}
	return [2]float64{sum / n, idleMax}
}

// reads measures the read methods.
func (m *measurer) reads(ctx context.Context, res *curveResult, pick func(int) acct) {
	res.Requests["getRecord"] = timed(ctx, m.samples(2000), 1, func(ctx context.Context, _, i int) error {
		_, err := m.call(ctx, "com.atproto.repo.getRecord",
			url.Values{"repo": {pick(i).did}, "collection": {"app.bsky.actor.profile"}, "rkey": {"self"}}, "", nil, nil)
		return err
	})
	res.Requests["listRecords"] = timed(ctx, m.samples(1000), 1, func(ctx context.Context, _, i int) error {
		_, err := m.call(ctx, "com.atproto.repo.listRecords",
			url.Values{"repo": {pick(i + 7).did}, "collection": {"app.bsky.feed.like"}, "limit": {"50"}}, "", nil, nil)
		return err
	})
	res.Requests["resolveHandle"] = timed(ctx, m.samples(2000), 1, func(ctx context.Context, _, i int) error {
		_, err := m.call(ctx, "com.atproto.identity.resolveHandle", url.Values{"handle": {pick(i + 13).handle}}, "", nil, nil)
		return err
	})
	// Each median account once: every answer is an export, none comes
	// from the server's CAR cache.
	res.Requests["getRepoMedian"] = timed(ctx, min(m.samples(100), len(m.info.medians)), 1, func(ctx context.Context, _, i int) error {
		_, err := m.call(ctx, "com.atproto.sync.getRepo", url.Values{"did": {m.info.medians[i].did}}, "", nil, nil)
		return err
	})
	// The largest: the first answer is an export, the repeats come from
	// the CAR cache.
	t := time.Now()
	n, err := m.call(ctx, "com.atproto.sync.getRepo", url.Values{"did": {m.info.largest.did}}, "", nil, nil)
	if err == nil {
		res.Walks["getRepoLargest"] = &walkFigures{Seconds: time.Since(t).Seconds(), Bytes: n, Note: "export"}
	}
	res.Requests["getRepoLargestCached"] = timed(ctx, 5, 1, func(ctx context.Context, _, i int) error {
		_, err := m.call(ctx, "com.atproto.sync.getRepo", url.Values{"did": {m.info.largest.did}}, "", nil, nil)
		return err
	})
}
