package pds

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
)

// upstream is a misbehaving service on 127.0.0.1 that counts its calls.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t *testing.T, tls bool, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	wrapped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		h(w, r)
	})
	if tls {
		u.Server = httptest.NewTLSServer(wrapped)
	} else {
		u.Server = httptest.NewServer(wrapped)
	}
	t.Cleanup(u.Close)
	return u
}

// A service whose DID resolves to 127.0.0.1 is out of reach unless the
// operator allows it: refused when dialling, answered like any service
// that cannot be reached, and never called.
func TestProxyRefusesLoopbackWithoutAllowList(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	e := newProxyEnv(t, proxyEnvOptions{noAllow: true, logs: logs})
	u := e.createUser(t)
	up := newUpstream(t, true, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "{}") })
	did := e.registerService(t, "bsky_chat", up.URL)
	res := e.call(t, "chat.bsky.convo.listConvos", u.access, did.String()+"#bsky_chat", nil)
	requireNamedError(t, res, http.StatusBadGateway, "UpstreamFailure")
	require.Zero(t, up.hits.Load())

	// The configured app view on 127.0.0.1 is no exception; the log
	// names the setting that would let it be reached.
	requireNamedError(t, e.call(t, "app.bsky.feed.getTimeline", u.access, "", nil), http.StatusBadGateway, "UpstreamFailure")
	e.requireNoUpstreamCall(t)
	require.Contains(t, logs.String(), `hint="the service is on a private address, or on plain http outside --proxy-allow-private: allow its network with --proxy-allow-private (BULWARK_PROXY_ALLOW_PRIVATE)"`)
}

// Upstreams that send too much, stall, or redirect get named errors, and
// a redirect is never followed.
func TestProxyMisbehavingUpstreams(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, proxyEnvOptions{configure: func(c *config.Config) {
		// Short, so that the stalling upstream costs the test little; no
		// assertion depends on how long anything takes.
		c.ProxyHeaderTimeout, c.ProxyBodyTimeout = 300*time.Millisecond, 300*time.Millisecond
	}})
	u := e.createUser(t)
	const elevenMB = 11 << 20
	chunk := make([]byte, 64<<10)
	send := func(w http.ResponseWriter, announce bool) {
		if announce {
			w.Header().Set("Content-Length", strconv.Itoa(elevenMB))
		}
		w.Header().Set("Content-Type", "application/json")
		for n := 0; n < elevenMB; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
	stalled := make(chan struct{})
	t.Cleanup(func() { close(stalled) })
	via := func(h http.HandlerFunc) (*upstream, string) {
		up := newUpstream(t, false, h)
		return up, e.registerService(t, "bsky_appview", up.URL).String() + "#bsky_appview"
	}

	_, big := via(func(w http.ResponseWriter, r *http.Request) { send(w, true) })
	res := e.call(t, "app.bsky.actor.getProfile", u.access, big, nil)
	requireNamedError(t, res, http.StatusBadGateway, "UpstreamFailure")
	require.Contains(t, res.str(t, "message"), strconv.Itoa(10<<20))

	// Without a Content-Length the answer has started when the limit is
	// passed: the client sees a broken transfer, never a short body that
	// looks whole.
	_, chunked := via(func(w http.ResponseWriter, r *http.Request) { send(w, false) })
	req, err := http.NewRequest(http.MethodGet, e.url+"/xrpc/app.bsky.actor.getProfile", nil)
	require.NoError(t, err)
	req.Header.Set("Atproto-Proxy", chunked)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Error(t, err)
	require.LessOrEqual(t, n, int64(10<<20))

	_, stall := via(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stalled:
		case <-r.Context().Done():
		}
	})
	requireNamedError(t, e.call(t, "app.bsky.actor.getProfile", u.access, stall, nil), http.StatusGatewayTimeout, "UpstreamTimeout")

	_, moved := via(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, e.fakes.AppView.URL+r.URL.RequestURI(), http.StatusFound)
	})
	requireNamedError(t, e.call(t, "app.bsky.actor.getProfile", u.access, moved, nil), http.StatusBadGateway, "UpstreamFailure")
	e.requireNoUpstreamCall(t)
}

// timeline is an app view getTimeline answer of about size bytes, by an
// author other than the caller, from long ago, shaped like Bluesky's
// (nested views, many short fields).
func timeline(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"feed":[`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"post":{"uri":"at://did:plc:someoneelse234567abcdef/app.bsky.feed.post/3k%08d","cid":"bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3h%02d",`+
			`"author":{"did":"did:plc:author%016d","handle":"author%d.bsky.social","displayName":"Author %d","avatar":"https://cdn.bsky.app/img/avatar/plain/did:plc:author%016d/bafkrei%d@jpeg",`+
			`"viewer":{"muted":false,"blockedBy":false},"labels":[],"createdAt":"2023-05-01T00:00:00.000Z"},`+
			`"record":{"$type":"app.bsky.feed.post","text":"post number %d says something about the weather, the news, and %d other things","langs":["en"],"createdAt":"2024-01-01T00:00:00.000Z"},`+
			`"replyCount":%d,"repostCount":%d,"likeCount":%d,"quoteCount":0,"indexedAt":"2024-01-01T00:00:00.000Z","viewer":{"threadMuted":false,"embeddingDisabled":false},"labels":[]}}`,
			i, i%100, i, i, i, i, i, i, i, i%7, i%13, i%29)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// timelines is an app view that answers getTimeline with a timeline of
// the size asked for (?size=small|large), stamped with rev when the
// request asks (?rev=1).
func timelines(t *testing.T, rev *atomic.Pointer[string]) *upstream {
	small, large := timeline(50<<10), timeline(3<<20)
	return newUpstream(t, false, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("rev") != "" {
			w.Header().Set("Atproto-Repo-Rev", *rev.Load())
		}
		body := small
		if r.URL.Query().Get("size") == "large" {
			body = large
		}
		_, _ = w.Write(body)
	})
}

// A proxied answer held back for read-after-write draws on the in-flight
// budget as it grows, and one that does not fit is refused with 503
// before anything reaches the client; a relayed stream of any size holds
// only its fixed share. Only the configured app view's answers are held
// back.
func TestProxyBudget(t *testing.T) {
	t.Parallel()
	var seen atomic.Pointer[string]
	appView := timelines(t, &seen)
	// Half of it is the app view's pool: room for the small answer held
	// back, never for the large one.
	b := budget.New(budget.Config{Capacity: 8 << 20, MaxQueue: -1})
	e := newProxyEnv(t, proxyEnvOptions{
		configure: func(c *config.Config) { c.AppViewURL = appView.URL },
		options:   func(o *Options) { o.Budget = b },
	})
	u := e.createUser(t)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("old")}).ok(t)
	rev, err := e.engine.Rev(context.Background(), u.did)
	require.NoError(t, err)
	seen.Store(&rev)
	e.post(t, "com.atproto.repo.createRecord", u.access, map[string]any{"repo": u.did, "collection": "app.bsky.feed.post", "record": post("new")}).ok(t)
	other := e.registerService(t, "bsky_appview", timelines(t, &seen).URL).String() + "#bsky_appview"
	get := func(size string, stale bool, header string) xrpcResult {
		q := url.Values{"size": {size}}
		if stale {
			q.Set("rev", "1")
		}
		return e.call(t, "app.bsky.feed.getTimeline", u.access, header, q)
	}

	res := get("small", true, "").ok(t)
	require.NotEmpty(t, res.header.Get("Atproto-Upstream-Lag"), "spliced within the budget")

	refused := get("large", true, "")
	requireNamedError(t, refused, http.StatusServiceUnavailable, "ServiceOverloaded")
	require.NotEmpty(t, refused.header.Get("Retry-After"))
	require.Equal(t, int64(0), b.Stats().InUse, "everything given back")

	// The same 3 MB relayed as it comes (the app view is not behind)
	// needs no more than the fixed share.
	res = get("large", false, "").ok(t)
	require.GreaterOrEqual(t, len(res.body), 3<<20)
	require.Equal(t, int64(0), b.Stats().InUse)

	// Another app view, named by a header, is relayed even when behind:
	// nothing it sends is held back, and its rev still reaches the client.
	for _, size := range []string{"small", "large"} {
		res = get(size, true, other).ok(t)
		require.Empty(t, res.header.Get("Atproto-Upstream-Lag"))
		require.Equal(t, rev, res.header.Get("Atproto-Repo-Rev"))
	}
	require.Equal(t, int64(0), b.Stats().InUse)
}
