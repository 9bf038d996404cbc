package console_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/eventlog"
)

// A consumer refused with FutureCursor (its cursor is beyond our newest
// event, as after restoring a backup) is on the overview with its cursor,
// our head and the raise-seq command that lets it in.
func TestOverviewShowsFutureCursorConsumers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for i := range 2 {
		enc, err := eventlog.EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{Did: fmt.Sprintf("did:plc:ahead%019d", i), Time: syntax.DatetimeNow().String()})
		require.NoError(t, err)
		require.NoError(t, eventlog.Append(ctx, e.pool, enc))
	}
	e.seq.Wake()
	head := e.seqs.wait(t, ctx, 2)
	cursor := head + 500
	for range 3 {
		conn, resp, err := websocket.DefaultDialer.Dial(fmt.Sprintf("ws://%s/xrpc/com.atproto.sync.subscribeRepos?cursor=%d", e.host, cursor),
			http.Header{"User-Agent": {"appview/2 (restored-test)"}})
		require.NoError(t, err)
		resp.Body.Close()
		_, msg, err := conn.ReadMessage()
		require.NoError(t, err)
		require.Contains(t, string(msg), "FutureCursor")
		conn.Close()
	}

	b := e.browser(t)
	b.mustLogin()
	var p page
	require.Eventually(t, func() bool {
		p = b.get(console.Prefix)
		return strings.Contains(p.body, "Consumers ahead of our sequence") && strings.Contains(p.body, "<td>3</td>")
	}, waitLimit, 10*time.Millisecond, "the overview lists the consumer refused three times")
	require.Equal(t, http.StatusOK, p.status)
	require.Contains(t, p.body, "appview/2 (restored-test)")
	require.Contains(t, p.body, fmt.Sprintf("<td>%d</td>", cursor))
	require.Contains(t, p.body, fmt.Sprintf("<td>%d</td>", head))
	require.Contains(t, p.body, fmt.Sprintf("<code>bulwark admin firehose raise-seq --floor %d --reason &#34;consumers ahead of our sequence&#34;</code>", cursor))
}
