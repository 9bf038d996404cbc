package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/fakeservices"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// TestLocalAppViewRefusedAtStart: an app view (or moderation or report
// service) the server could never reach stops serve before anything is
// stored, with an error naming the setting that would allow it.
func TestLocalAppViewRefusedAtStart(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--appview-url", "--mod-service-url", "--report-service-url"} {
		dataDir := filepath.Join(t.TempDir(), "data")
		var out bytes.Buffer
		code := run(context.Background(), []string{"serve", flag, "http://localhost:2584", "--data-dir", dataDir, "--listen", "127.0.0.1:0"}, &out, &out)
		require.Equal(t, 2, code, out.String())
		require.Contains(t, out.String(), flag)
		require.Contains(t, out.String(), "--proxy-allow-private (BULWARK_PROXY_ALLOW_PRIVATE)")
		require.NoDirExists(t, dataDir, "nothing stored")
	}
}

// binaryClient calls a running server's XRPC methods.
type binaryClient struct {
	t    *testing.T
	base string
}

func (c binaryClient) get(nsid, token, proxyHeader string, q url.Values) (int, http.Header, map[string]any) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.base+"/xrpc/"+nsid+"?"+q.Encode(), nil)
	require.NoError(c.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if proxyHeader != "" {
		req.Header.Set("Atproto-Proxy", proxyHeader)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	var out map[string]any
	body, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	_ = json.Unmarshal(body, &out)
	return resp.StatusCode, resp.Header, out
}

// TestProxyThroughBinary runs the binary as the README starts it, with
// only the settings a local app view needs (its URL and DID, the PLC
// directory its DID is in, --proxy-allow-private for 127.0.0.0/8),
// against a fake app view that has seen only a new account's genesis and
// a trickling service anyone can name in an atproto-proxy header:
//
//   - read-after-write: the account's new post, which the app view
//     answers NotFound, is its thread; its feed, which the app view
//     answers empty, has it;
//   - an app view's 501 reaches the client as 501;
//   - 150 trickling proxied answers from one address: that address gets
//     429 beyond its share, and an anonymous getRepo is answered
//     meanwhile.
func TestProxyThroughBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	t.Parallel()
	ctx := context.Background()
	bin := buildBinary(t)
	_, plc := plctest.NewServer(t)
	fakes, err := fakeservices.Start(ctx, fakeservices.Config{PLCURL: plc.URL})
	require.NoError(t, err)
	t.Cleanup(fakes.Close)
	port := freePort(t)
	base := "http://localhost:" + strconv.Itoa(port)
	env := append(cleanEnv(),
		"BULWARK_DATABASE_URL="+dbtest.NewURL(t), "BULWARK_DATA_DIR="+filepath.Join(t.TempDir(), "data"),
		"BULWARK_LISTEN=127.0.0.1:"+strconv.Itoa(port), "BULWARK_PLC_URL="+plc.URL,
		"BULWARK_APPVIEW_URL="+fakes.AppView.URL, "BULWARK_APPVIEW_DID="+fakes.AppView.DID.String(),
		"BULWARK_PROXY_ALLOW_PRIVATE=127.0.0.0/8")
	startBinary(t, bin, base, env)
	c := binaryClient{t: t, base: base}

	status, acct := createAccount(t, base, "alice.test")
	require.Equal(t, http.StatusOK, status, "%v", acct)
	did, token := acct["did"].(string), acct["accessJwt"].(string)
	status, _, latest := c.get("com.atproto.sync.getLatestCommit", "", "", url.Values{"did": {did}})
	require.Equal(t, http.StatusOK, status)
	fakes.SetRepoRev(syntax.DID(did), latest["rev"].(string))
	created := postOK(t, base, "com.atproto.repo.createRecord", token, map[string]any{"repo": did, "collection": "app.bsky.feed.post",
		"record": map[string]any{"$type": "app.bsky.feed.post", "text": "hello", "createdAt": time.Now().UTC().Format(time.RFC3339)}})
	uri := created["uri"].(string)

	status, hdr, thread := c.get("app.bsky.feed.getPostThread", token, "", url.Values{"uri": {uri}})
	require.Equal(t, http.StatusOK, status, "%v", thread)
	require.NotEmpty(t, hdr.Get("Atproto-Upstream-Lag"))
	require.Equal(t, uri, thread["thread"].(map[string]any)["post"].(map[string]any)["uri"])
	status, _, feed := c.get("app.bsky.feed.getAuthorFeed", token, "", url.Values{"actor": {did}})
	require.Equal(t, http.StatusOK, status)
	require.Len(t, feed["feed"], 1)

	status, _, body := c.get("app.bsky.unspecced.getNothingAtAll", "", "", nil)
	require.Equal(t, http.StatusNotImplemented, status, "%v", body)
	require.Equal(t, "MethodNotImplemented", body["error"])

	trickleFromOneAddress(t, c, plc.URL, did)
}

// trickleFromOneAddress sends 150 anonymous requests to a trickling
// service and checks that all but the address's share are refused at
// once and that an anonymous getRepo is answered while the rest trickle.
func trickleFromOneAddress(t *testing.T, c binaryClient, plcURL, did string) {
	var mu sync.Mutex
	inFlight := 0
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		for {
			if _, err := io.WriteString(w, " "); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(2 * time.Second):
			}
		}
	}))
	t.Cleanup(up.Close)
	svc, _, err := fakeservices.Register(context.Background(), plcURL, map[string]didplc.OpService{"bsky_appview": {Type: "BskyAppView", Endpoint: up.URL}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	refused := make(chan struct{}, 150)
	for range 150 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/xrpc/app.bsky.feed.getTimeline", nil)
		require.NoError(t, err)
		req.Header.Set("Atproto-Proxy", svc.String()+"#bsky_appview")
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				refused <- struct{}{}
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	limit := time.After(waitLimit)
	for range 150 - config.DefaultProxyMaxPerClient {
		select {
		case <-refused:
		case <-limit:
			t.Fatal("the requests over the address's share were not refused")
		}
	}
	start := time.Now()
	resp, err := http.Get(c.base + "/xrpc/com.atproto.sync.getRepo?did=" + url.QueryEscape(did))
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	mu.Lock()
	t.Logf("getRepo answered %d bytes in %s with %d trickling answers in flight", n, time.Since(start), inFlight)
	mu.Unlock()
}
