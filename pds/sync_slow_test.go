package pds

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/repo"
)

// A getRepo?since answer is exported from the database before any of it
// is sent: a client that stops reading holds no pooled connection (nor the
// export's snapshot) while the server waits to send it the rest. Streamed
// from the export's transaction instead, one such client per pool
// connection would stop the server.
func TestGetRepoSinceSlowClientHoldsNoConnection(t *testing.T) {
	t.Parallel()
	b := syncSetup(t, syncOptions{})
	did := b.newAccount(t, "slow", account.StatusActive)
	first := b.writePosts(t, did, "a", 1)
	// About 24 MB of records after first: far more than the loopback
	// socket buffers hold, so the server must wait for the client.
	big := strings.Repeat("x", 100_000)
	for c := range 24 {
		var writes []repo.Write
		for i := range 10 {
			writes = append(writes, repo.Write{Action: repo.ActionCreate, Collection: "app.bsky.feed.post",
				RKey: syntax.RecordKey(fmt.Sprintf("big%03d%02d", c, i)), Record: postRecord(big)})
		}
		_, err := b.engine.Apply(context.Background(), did, writes, nil)
		require.NoError(t, err)
	}

	u, err := url.Parse(b.url)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()
	q := url.Values{"did": {did.String()}, "since": {first.Rev}}
	req, err := http.NewRequest(http.MethodGet, b.url+"/xrpc/com.atproto.sync.getRepo?"+q.Encode(), nil)
	require.NoError(t, err)
	require.NoError(t, req.Write(conn))
	// The headers only; the body stays unread.
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { return b.pool.Stat().AcquiredConns() == 0 }, 30*time.Second, 10*time.Millisecond,
		"a client that does not read holds a database connection")

	// Read now, the answer is whole.
	commit, _, err := atrepo.LoadCommitFromCAR(context.Background(), resp.Body)
	require.NoError(t, err)
	require.Greater(t, commit.Rev, first.Rev)
	n, err := io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.Greater(t, n, int64(20_000_000))
}
