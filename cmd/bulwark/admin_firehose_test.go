package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"
)

// TestFirehoseCommandsPrintText: emit-sync, raise-seq and the consumer
// list print text without --json, like the other admin commands, and
// JSON with it.
func TestFirehoseCommandsPrintText(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{})
	var acct createdAccount
	s.adminJSON(t, &acct, "account", "create", "--handle", "erin", "--email", "erin@example.com")
	s.sequenced(t, []testUser{{did: acct.DID}})

	requireText := func(out string) {
		t.Helper()
		require.False(t, json.Valid([]byte(out)), "text, not JSON: %s", out)
		require.NotContains(t, out, "{")
	}
	// Every event so far is sequenced, so nothing moves the seq
	// between these two.
	out := s.admin(t, "firehose", "raise-seq", "--floor", "1000")
	requireText(out)
	require.Regexp(t, `^last seq raised from \d+ to 1000: the next event gets 1001 or more\n$`, out)
	out = s.admin(t, "firehose", "raise-seq", "--floor", "10")
	require.Equal(t, "last seq unchanged at 1000, already at least 10\n", out)

	out = s.admin(t, "firehose", "emit-sync", "--did", acct.DID)
	requireText(out)
	require.Contains(t, out, "emitted a #sync of "+acct.DID+" at rev ")

	out = s.admin(t, "firehose", "consumers")
	requireText(out)
	require.Contains(t, out, "no subscribeRepos consumer")
	// A consumer that has been sent a frame is one the server tracks.
	ws, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(s.url, "http")+"/xrpc/com.atproto.sync.subscribeRepos?cursor=0", nil)
	require.NoError(t, err)
	resp.Body.Close()
	defer ws.Close()
	require.NoError(t, ws.SetReadDeadline(time.Now().Add(waitLimit)))
	_, _, err = ws.ReadMessage()
	require.NoError(t, err)
	out = s.admin(t, "firehose", "consumers")
	require.Contains(t, out, "ADDRESS")
	require.Contains(t, out, "127.0.0.1")
	require.True(t, strings.HasSuffix(strings.TrimSpace(strings.Split(out, "\n")[1]), "ok"), out)

	var raised struct {
		LastSeq int64 `json:"lastSeq"`
		Changed bool  `json:"changed"`
	}
	s.adminJSON(t, &raised, "firehose", "raise-seq", "--floor", "5")
	require.GreaterOrEqual(t, raised.LastSeq, int64(1000))
	require.False(t, raised.Changed)
}
