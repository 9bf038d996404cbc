package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

func TestHeaderAllowLists(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got http.Header
	var gotBody string
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got, gotBody = r.Header.Clone(), string(b)
		mu.Unlock()
		h := w.Header()
		for k, v := range map[string]string{
			"Content-Type": "application/json", "Content-Language": "en",
			"Atproto-Repo-Rev": "3l6oveex3ii2l", "Atproto-Content-Labelers": "did:plc:labeler",
			"Retry-After": "5", "Set-Cookie": "session=upstream", "X-Upstream-Secret": "s3cret",
			"Access-Control-Allow-Origin": "https://evil.test", "Connection": "X-Upstream-Secret",
		} {
			h.Set(k, v)
		}
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID}, Caller{})
	sent := map[string]string{
		"Accept-Language": "fr", "Atproto-Accept-Labelers": "did:plc:labeler;redact",
		"X-Bsky-Topics": "art", "Accept-Encoding": "gzip",
		"Authorization": "Bearer client-token", "Cookie": "a=b", "X-Forwarded-For": "10.0.0.1",
		"DPoP": "proof", "X-Custom": "1", "Content-Type": "text/plain", "Atproto-Proxy-Extra": "x",
	}
	r := f.get(t, "app.bsky.feed.getTimeline?limit=5&cursor=abc", sent)
	require.Equal(t, 200, r.status)
	require.Equal(t, `{"ok":true}`, r.body)

	mu.Lock()
	for _, k := range []string{"Accept-Language", "Atproto-Accept-Labelers", "X-Bsky-Topics", "Accept-Encoding"} {
		require.Equal(t, sent[k], got.Get(k), k)
	}
	for _, k := range []string{"Authorization", "Cookie", "X-Forwarded-For", "Dpop", "X-Custom", "Content-Type", "Atproto-Proxy-Extra"} {
		require.Empty(t, got.Get(k), "%s must not be forwarded", k)
	}
	mu.Unlock()
	for _, k := range []string{"Content-Language", "Atproto-Repo-Rev", "Atproto-Content-Labelers", "Retry-After"} {
		require.NotEmpty(t, r.header.Get(k), k)
	}
	for _, k := range []string{"Set-Cookie", "X-Upstream-Secret", "Access-Control-Allow-Origin"} {
		require.Empty(t, r.header.Get(k), "%s must not be passed back", k)
	}

	// POST: the body and its content headers go along.
	r = f.do(t, http.MethodPost, "app.bsky.actor.putThing", strings.NewReader(`{"a":1}`),
		map[string]string{"Content-Type": "application/json", "Content-Encoding": "identity"})
	require.Equal(t, 200, r.status)
	mu.Lock()
	require.Equal(t, `{"a":1}`, gotBody)
	require.Equal(t, "application/json", got.Get("Content-Type"))
	require.Equal(t, "identity", got.Get("Content-Encoding"))
	mu.Unlock()

	// No Accept-Encoding from the client: identity, as the reference does.
	f.get(t, "app.bsky.feed.getTimeline", nil)
	mu.Lock()
	require.Equal(t, "identity", got.Get("Accept-Encoding"))
	mu.Unlock()

	// An oversized forwarded header is refused, not truncated.
	r = f.get(t, "app.bsky.feed.getTimeline", map[string]string{"Atproto-Accept-Labelers": strings.Repeat("a", 9000)})
	require.Equal(t, 400, r.status)
}

func TestMethodsAndBodies(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Length", "20")
			return
		}
		_, _ = io.WriteString(w, `{"n":`+strconv.FormatInt(n, 10)+`}`)
	})
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID, MaxRequestBytes: 1000}, Caller{})

	r := f.do(t, http.MethodPut, "app.bsky.feed.getTimeline", nil, nil)
	require.Equal(t, 400, r.status)
	r = f.do(t, http.MethodDelete, "app.bsky.feed.getTimeline", nil, nil)
	require.Equal(t, 400, r.status)
	require.Zero(t, up.hits.Load(), "refused methods make no upstream call")

	r = f.do(t, http.MethodHead, "app.bsky.feed.getTimeline", nil, nil)
	require.Equal(t, 200, r.status)
	require.Equal(t, "20", r.header.Get("Content-Length"))
	require.Empty(t, r.body)

	r = f.do(t, http.MethodPost, "com.example.post", bytes.NewReader(make([]byte, 1000)), nil)
	require.Equal(t, 200, r.status)
	require.Contains(t, r.body, `"n":1000`)

	hits := up.hits.Load()
	r = f.do(t, http.MethodPost, "com.example.post", bytes.NewReader(make([]byte, 1001)), nil)
	require.Equal(t, 413, r.status)
	require.Equal(t, "PayloadTooLarge", r.err["error"])
	require.Equal(t, hits, up.hits.Load(), "a declared oversize body is refused before any upstream call")

	// Without a declared length, the limit holds while streaming.
	r = f.do(t, http.MethodPost, "com.example.post", io.MultiReader(bytes.NewReader(make([]byte, 5000))), nil)
	require.Equal(t, 413, r.status)
}

func TestUpstreamStatuses(t *testing.T) {
	t.Parallel()
	elsewhere := newUpstream(t, jsonOK(`{"hijacked":true}`))
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Query().Get("case") {
		case "400":
			w.WriteHeader(400)
			_, _ = io.WriteString(w, `{"error":"NotFound","message":"Post not found: at://x"}`)
		case "401":
			w.WriteHeader(401)
			_, _ = io.WriteString(w, `{"error":"AuthMissing","message":"Authentication Required"}`)
		case "500":
			w.WriteHeader(500)
			_, _ = io.WriteString(w, `{"error":"InternalServerError","message":"db down\u0000"}`)
		case "501":
			w.WriteHeader(501)
			_, _ = io.WriteString(w, `{"error":"MethodNotImplemented","message":"Method Not Implemented"}`)
		case "502":
			w.WriteHeader(502)
			_, _ = io.WriteString(w, `{"error":"UpstreamFailure","message":"the feed generator is down"}`)
		case "503":
			w.WriteHeader(503)
		case "504":
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(504)
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, `{"error":"UpstreamTimeout","message":"the feed generator timed out"}`)
			_ = zw.Close()
		case "599":
			w.WriteHeader(599)
			_, _ = io.WriteString(w, `not json`)
		case "redirect":
			http.Redirect(w, r, elsewhere.URL+"/xrpc/app.bsky.feed.getTimeline", http.StatusFound)
		}
	})
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID}, Caller{})

	r := f.get(t, "app.bsky.feed.getPostThread?case=400", nil)
	require.Equal(t, 400, r.status)
	require.Equal(t, `{"error":"NotFound","message":"Post not found: at://x"}`, r.body, "4xx passed through as is")
	r = f.get(t, "app.bsky.feed.getPostThread?case=401", nil)
	require.Equal(t, 401, r.status)
	require.Equal(t, "AuthMissing", r.err["error"])

	r = f.get(t, "app.bsky.feed.getPostThread?case=500", nil)
	require.Equal(t, 502, r.status)
	require.Equal(t, "UpstreamFailure", r.err["error"])
	require.Contains(t, r.err["message"], "db down")
	require.NotContains(t, r.err["message"], "\x00")
	// Every other server error is passed on, as the reference PDS does:
	// its status, and its error name and message (or the status's own).
	for _, tc := range []struct {
		status        int
		name, message string
	}{
		{501, "MethodNotImplemented", "Method Not Implemented"},
		{502, "UpstreamFailure", "the feed generator is down"},
		{503, "NotEnoughResources", "upstream service answered 503 Service Unavailable"},
		{504, "UpstreamTimeout", "the feed generator timed out"},
		{599, "UpstreamFailure", "upstream service answered 599 "},
	} {
		r = f.get(t, "app.bsky.feed.getPostThread?case="+strconv.Itoa(tc.status), nil)
		require.Equal(t, tc.status, r.status)
		require.Equal(t, map[string]string{"error": tc.name, "message": tc.message}, r.err)
	}

	r = f.get(t, "app.bsky.feed.getPostThread?case=redirect", nil)
	require.Equal(t, 502, r.status)
	require.Contains(t, r.err["message"], "redirect")
	require.Zero(t, elsewhere.hits.Load(), "the redirect was not followed")

	dead := newUpstream(t, jsonOK(`{}`))
	dead.Close()
	f2 := newFront(t, Config{AppViewURL: dead.URL, AppViewDID: appViewDID}, Caller{})
	r = f2.get(t, "app.bsky.feed.getTimeline", nil)
	require.Equal(t, 502, r.status)
	require.Equal(t, "UpstreamFailure", r.err["error"])
	require.Contains(t, r.err["message"], "unreachable")
}

func TestServeHeaderForms(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, jsonOK(`{}`))
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID}, Caller{})
	for _, vals := range [][]string{{""}, {"did:web:appview.test#bsky_appview", "did:web:appview.test#bsky_appview"}, {"did:web:appview.test"}} {
		req, err := http.NewRequest(http.MethodGet, f.URL+"/xrpc/app.bsky.feed.getTimeline", nil)
		require.NoError(t, err)
		req.Header["Atproto-Proxy"] = vals
		resp, err := f.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 400, resp.StatusCode, vals)
	}
	require.Zero(t, up.hits.Load())
	r := f.get(t, "app.bsky.feed.getTimeline", map[string]string{"atproto-proxy": "did:web:appview.test#bsky_appview"})
	require.Equal(t, 200, r.status, "the configured app view, without resolving")
}

// bigBody serves n bytes, with or without a Content-Length.
func bigBody(n int, declare bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		if declare {
			w.Header().Set("Content-Length", strconv.Itoa(n))
		}
		chunk := make([]byte, 64<<10)
		for n > 0 {
			m := min(n, len(chunk))
			if _, err := w.Write(chunk[:m]); err != nil {
				return
			}
			n -= m
		}
	}
}

func TestResponseSizeLimit(t *testing.T) {
	t.Parallel()
	const elevenMB = 11 << 20
	declared := newUpstream(t, bigBody(elevenMB, true))
	streamed := newUpstream(t, bigBody(elevenMB, false))
	exact := newUpstream(t, bigBody(DefaultMaxResponseBytes, false))
	f := newFront(t, Config{AppViewURL: declared.URL, AppViewDID: appViewDID}, Caller{})
	r := f.get(t, "com.example.big", nil)
	require.Equal(t, 502, r.status, "refused before streaming")
	require.Equal(t, "UpstreamFailure", r.err["error"])
	require.Contains(t, r.err["message"], "larger than")

	f = newFront(t, Config{AppViewURL: streamed.URL, AppViewDID: appViewDID}, Caller{})
	resp, err := f.Client().Get(f.URL + "/xrpc/com.example.big")
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, "headers went out before the size was known")
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Error(t, err, "the client sees a broken transfer, not a short body that looks whole")
	require.LessOrEqual(t, n, int64(DefaultMaxResponseBytes))

	f = newFront(t, Config{AppViewURL: exact.URL, AppViewDID: appViewDID}, Caller{})
	resp, err = f.Client().Get(f.URL + "/xrpc/com.example.big")
	require.NoError(t, err)
	n, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.EqualValues(t, DefaultMaxResponseBytes, n, "exactly the limit passes")
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("stall") {
		case "headers":
		case "body":
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
		case "midway":
			_, _ = w.Write([]byte(`{"feed":[`))
			w.(http.Flusher).Flush()
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // before the upstream's Close waits for its handlers
	cfg := Config{AppViewURL: up.URL, AppViewDID: appViewDID, HeaderTimeout: 100 * time.Millisecond, BodyTimeout: 100 * time.Millisecond}
	f := newFront(t, cfg, Caller{})

	for _, stall := range []string{"headers", "body"} {
		r := f.get(t, "app.bsky.feed.getTimeline?stall="+stall, nil)
		require.Equal(t, 504, r.status, stall)
		require.Equal(t, "UpstreamTimeout", r.err["error"], stall)
	}
	// A POST: the wait for headers starts once the body has been sent.
	r := f.do(t, http.MethodPost, "com.example.proc?stall=headers", strings.NewReader(`{"a":1}`), nil)
	require.Equal(t, 504, r.status)
	require.Contains(t, r.err["message"], "did not answer")
	resp, err := f.Client().Get(f.URL + "/xrpc/app.bsky.feed.getTimeline?stall=midway")
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Error(t, err, "a stall after the body started aborts the transfer")
}

// trickler answers 200 at once, then a byte every 20 ms until the
// request ends, and reports on ended when it does.
func trickler(t *testing.T, ended chan<- struct{}) *upstream {
	return newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		defer func() { ended <- struct{}{} }()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(200)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := io.WriteString(w, " "); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	})
}

// An answer that keeps moving, a byte at a time, is cut off at its total
// deadline, and one that moves too slowly at its minimum rate, however
// short each wait between bytes: the client sees a broken transfer and
// the upstream's request ends. Without either bound the trickle would
// hold the request until the client gave up.
func TestAnswerDeadlines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"total", Config{TotalTimeout: 300 * time.Millisecond, MinRate: 1}},
		{"rate", Config{MinRate: 1000, MinRateAfter: 100 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ended := make(chan struct{}, 1)
			up := trickler(t, ended)
			cfg := tc.cfg
			cfg.AppViewURL, cfg.AppViewDID = up.URL, appViewDID
			f := newFront(t, cfg, Caller{})
			client := &http.Client{Transport: f.Client().Transport, Timeout: 20 * time.Second}
			resp, err := client.Get(f.URL + "/xrpc/app.bsky.feed.getTimeline")
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Error(t, err, "the transfer is broken off")
			require.NotErrorIs(t, err, context.DeadlineExceeded, "by the proxy, not by the client giving up")
			select {
			case <-ended:
			case <-time.After(20 * time.Second):
				t.Fatal("the upstream request was never ended")
			}
			var m dto.Metric
			require.NoError(t, f.p.metrics.requests.WithLabelValues("appview", "504").Write(&m))
			require.Equal(t, 1.0, m.GetCounter().GetValue(), "counted as a timeout")
		})
	}
}

func TestClientCancelPropagates(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	upstreamDone := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"feed":[`))
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done() // ends only if the proxy cancels its request
		close(upstreamDone)
	})
	f := newFront(t, Config{AppViewURL: up.URL, AppViewDID: appViewDID}, Caller{})
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.URL+"/xrpc/app.bsky.feed.getTimeline", nil)
	require.NoError(t, err)
	resp, err := f.Client().Do(req)
	require.NoError(t, err)
	buf := make([]byte, 9)
	_, err = io.ReadFull(resp.Body, buf)
	require.NoError(t, err)
	<-started
	cancel()
	resp.Body.Close()
	select {
	case <-upstreamDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not canceled with the client's")
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fail") != "" {
			w.WriteHeader(500)
			return
		}
		jsonOK(`{"ok":true}`)(w, r)
	})
	reg := prometheus.NewRegistry()
	cfg := Config{AppViewURL: up.URL, AppViewDID: appViewDID, Registerer: reg}
	f := newFront(t, cfg, Caller{})
	f.get(t, "app.bsky.feed.getTimeline", nil)
	f.get(t, "app.bsky.feed.getTimeline", nil)
	f.get(t, "app.bsky.feed.getTimeline?fail=1", nil)
	m := f.p.metrics
	value := func(c prometheus.Metric) *dto.Metric {
		var out dto.Metric
		require.NoError(t, c.Write(&out))
		return &out
	}
	require.Equal(t, 2.0, value(m.requests.WithLabelValues("appview", "200")).GetCounter().GetValue())
	require.Equal(t, 1.0, value(m.requests.WithLabelValues("appview", "502")).GetCounter().GetValue())
	require.Equal(t, 22.0, value(m.bytes.WithLabelValues("appview", "response")).GetCounter().GetValue())
	hist := m.duration.WithLabelValues("appview").(prometheus.Metric)
	require.EqualValues(t, 3, value(hist).GetHistogram().GetSampleCount())
	families, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, families, 3, "registered on the given registry")

	// A second proxy on the same registry shares the collectors.
	p2, err := New(cfg)
	require.NoError(t, err)
	require.Same(t, m.requests, p2.metrics.requests)
}
