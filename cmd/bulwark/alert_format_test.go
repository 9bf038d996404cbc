package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAlertWebhookInChatShape: with --alert-webhook-format slack, a
// stuck relay's alert reaches the webhook as the message Slack's incoming
// webhooks take ({"text": ...}), naming the relay, the event and the
// repair.
func TestAlertWebhookInChatShape(t *testing.T) {
	t.Parallel()
	// A relay that never gets past seq 0 while the server's head moves.
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/xrpc/com.atproto.sync.getHostStatus" {
			return // requestCrawl
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"hostname": r.URL.Query().Get("hostname"), "seq": 0, "status": "active"})
	}))
	t.Cleanup(relay.Close)
	bodies := make(chan map[string]any, 8)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body) == nil {
			bodies <- body
		}
	}))
	t.Cleanup(hook.Close)
	s := startLiveServer(t, serverOptions{extra: []string{
		"--crawlers", relay.URL, "--relay-watch-interval", "200ms", "--relay-stuck-for", "1s",
		"--alert-webhook", hook.URL, "--alert-webhook-format", "slack",
	}})
	var acct createdAccount
	s.adminJSON(t, &acct, "account", "create", "--handle", "dora", "--email", "dora@example.com")

	select {
	case body := <-bodies:
		require.Len(t, body, 1, "Slack's shape: only text: %v", body)
		text, _ := body["text"].(string)
		require.Contains(t, text, "relay_stuck")
		require.Contains(t, text, relay.URL[len("http://"):])
	case <-time.After(time.Minute):
		t.Fatal("no alert reached the webhook")
	}
}
