package oauth_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/oauth"
)

// TestClientFetchesSharedAndBounded: concurrent requests for one client
// share one fetch, a failed fetch is not repeated at once, and only so
// many distinct clients are fetched at the same time: beyond that a
// request is refused at once (503), not queued behind slow servers.
func TestClientFetchesSharedAndBounded(t *testing.T) {
	t.Parallel()
	// Fetches wait for the test, not for a clock.
	f := setup(t, fixtureOpts{configure: func(c *oauth.Config) { c.FetchTimeout = time.Hour }})
	c := f.rawClient("base", "atproto")
	cfg := indigo.NewPublicConfig("", c.redirect, []string{"atproto"})
	release := make(chan struct{})
	arrived := make(chan struct{}, 100)
	var mu sync.Mutex
	fetches := map[string]int{}
	f.mux.HandleFunc("GET /slow/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fetches[r.URL.Path]++
		mu.Unlock()
		arrived <- struct{}{}
		<-release
		if strings.HasSuffix(r.URL.Path, "/missing.json") {
			http.NotFound(w, r)
			return
		}
		md := cfg.ClientMetadata()
		md.ClientID = f.srv.URL + r.URL.Path
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(md)
	})
	fetched := func(path string) int {
		mu.Lock()
		defer mu.Unlock()
		return fetches[path]
	}
	// request is a pushed request for the client at path, built here and
	// sent by whoever calls send.
	type request struct{ body, proof string }
	request1 := func(path string) request {
		form := c.parForm()
		form.Set("client_id", f.srv.URL+path)
		return request{form.Encode(), c.proof(oauth.PathPAR)}
	}
	send := func(r request) answer { return c.post(oauth.PathPAR, r.body, r.proof) }

	// Five requests for one client and 31 for others fill the 32 fetch
	// slots; the shared client is fetched once.
	var reqs []request
	for range 5 {
		reqs = append(reqs, request1("/slow/shared.json"))
	}
	for i := range 31 {
		reqs = append(reqs, request1(fmt.Sprintf("/slow/%d.json", i)))
	}
	statuses := make(chan int, len(reqs))
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() { statuses <- send(r).status })
	}
	for range 32 {
		<-arrived
	}
	busy := send(request1("/slow/one-too-many.json"))
	require.Equal(t, http.StatusServiceUnavailable, busy.status, busy.body)
	require.Equal(t, oauth.CodeUnavailable, busy.str("error"))
	require.NotEmpty(t, busy.header.Get("Retry-After"))
	close(release)
	wg.Wait()
	close(statuses)
	for status := range statuses {
		require.Equal(t, http.StatusCreated, status)
	}
	require.Equal(t, 1, fetched("/slow/shared.json"))

	// The refused client is fetched once the slots are free; a missing
	// document is remembered as missing for a while.
	require.Equal(t, http.StatusCreated, send(request1("/slow/one-too-many.json")).status)
	for range 3 {
		require.Equal(t, "invalid_client", send(request1("/slow/missing.json")).str("error"))
	}
	require.Equal(t, 1, fetched("/slow/one-too-many.json"))
	require.Equal(t, 1, fetched("/slow/missing.json"))
}
