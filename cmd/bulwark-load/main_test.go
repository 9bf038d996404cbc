package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"
)

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
	require.Equal(t, 2, run(context.Background(), []string{"--bogus"}, io.Discard, io.Discard))
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
