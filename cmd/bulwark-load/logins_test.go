package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLoginsBurst: "logins" creates the accounts it cannot log in to,
// then signs everyone in together, round after round, and reports what
// the server answered: here every third login is refused with 503.
func TestLoginsBurst(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	created := map[string]bool{}
	logins := 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST /xrpc/com.atproto.server.createAccount", func(w http.ResponseWriter, r *http.Request) {
		var in map[string]string
		_ = json.NewDecoder(r.Body).Decode(&in)
		mu.Lock()
		created[in["handle"]] = true
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]string{"did": "did:plc:" + in["handle"], "accessJwt": "token"})
	})
	mux.HandleFunc("POST /xrpc/com.atproto.server.createSession", func(w http.ResponseWriter, r *http.Request) {
		var in map[string]string
		_ = json.NewDecoder(r.Body).Decode(&in)
		mu.Lock()
		defer mu.Unlock()
		if !created[in["identifier"]] {
			http.Error(w, `{"error":"AuthenticationRequired"}`, http.StatusUnauthorized)
			return
		}
		logins++
		switch {
		case logins%3 == 0:
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":"ServiceOverloaded"}`, http.StatusServiceUnavailable)
		default:
			_ = json.NewEncoder(w).Encode(map[string]string{"did": "did:plc:" + in["identifier"], "accessJwt": "token"})
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"logins", "--url", srv.URL, "--concurrency", "3", "--rounds", "2", "--pause", "0"}, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	require.Len(t, created, 3)
	require.Contains(t, out.String(), "logins x3")
	require.Contains(t, out.String(), "200=4 503=2")
}
