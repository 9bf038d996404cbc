package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serve wires the console, the relay watch and the alert webhook as the
// settings say: the console on the private listener only, the relays of
// --crawlers asked for our host through the guarded client (allowed to
// reach the 127.0.0.1 they name), the webhook's URL never logged.
func TestConsoleAndRelayWatchWiring(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	hostname := make(chan string, 64)
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case hostname <- r.URL.Query().Get("hostname"):
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"hostname": r.URL.Query().Get("hostname"), "seq": 0, "status": "active"})
	}))
	t.Cleanup(relay.Close)
	hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(hook.Close)
	private := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := startLiveServer(t, serverOptions{extra: []string{
		"--admin-console", "private", "--metrics-listen", private,
		"--crawlers", relay.URL, "--relay-watch-interval", "100ms",
		"--alert-webhook", hook.URL + "/hooks/wiringsecret",
	}})

	select {
	case got := <-hostname:
		require.Equal(t, s.hostname, got)
	case <-time.After(waitLimit):
		t.Fatal("the relay watch never asked the relay")
	}
	status := func(url string) int {
		resp, err := http.Get(url)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, status("http://"+private+"/admin/login"))
	require.Equal(t, http.StatusOK, status("http://"+private+"/metrics"))
	require.Equal(t, http.StatusNotFound, status(s.url+"/admin/login"), "not on the public listener")
	logs := s.logs.String()
	require.Contains(t, logs, "relay watch on")
	require.Contains(t, logs, "operator console on the private listener")
	require.NotContains(t, logs, "wiringsecret")
	require.True(t, strings.Contains(logs, "alerts go to a webhook"))
}

// The console is on the public listener by default, and nowhere with
// --admin-console off; a wrong password there is limited per address.
func TestConsolePublicAndOff(t *testing.T) {
	t.Parallel()
	get := func(url string) int {
		resp, err := http.Get(url)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	public := startLiveServer(t, serverOptions{extra: []string{"--ratelimits", "consoleLogin=2/5m"}})
	require.Equal(t, http.StatusOK, get(public.url+"/admin/login"))
	for i, want := range []int{http.StatusForbidden, http.StatusForbidden, http.StatusTooManyRequests} {
		resp, err := http.PostForm(public.url+"/admin/login", map[string][]string{"password": {"wrong"}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, "attempt %d", i+1)
	}
	off := startLiveServer(t, serverOptions{extra: []string{"--admin-console", "off"}})
	require.Equal(t, http.StatusNotFound, get(off.url+"/admin/login"))
	require.Equal(t, http.StatusNotFound, get(off.url+"/admin/"))
}
