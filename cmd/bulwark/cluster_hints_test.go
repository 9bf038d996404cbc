package main

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// freeUDPPort is a UDP port nothing listens on now.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// TestServeCommitHints: two servers on one database, each with
// --cluster-hint-addr, take an account's writes in turn (as behind a
// round-robin balancer): each node's cached tree follows the other's
// commits from its hints, and every write succeeds. A hint address the
// other nodes could not send to is refused at start.
func TestServeCommitHints(t *testing.T) {
	t.Parallel()
	tc := newTestCluster(t)
	dbURL, plc, host := tc.dbURL, tc.plc, tc.host
	node := func() serverOptions {
		return tc.node("--cluster-hint-addr", "127.0.0.1:"+strconv.Itoa(freeUDPPort(t)))
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--database-url", dbURL, "--hostname", host,
		"--plc-url", plc.URL, "--data-dir", t.TempDir(), "--cluster-hint-addr", "0.0.0.0:2584"}, &stdout, &stderr)
	require.Equal(t, 2, code, "serve started with an unspecified hint address")
	require.Contains(t, stderr.String(), "--cluster-hint-addr")
	require.Contains(t, stderr.String(), "this node's own IP")

	a := startLiveServer(t, node())
	b := startLiveServer(t, node())
	require.Contains(t, b.logs.String(), `msg="commit hints on"`)

	acct, token := tc.account(t, a, a, "hinted")

	post := map[string]any{"$type": "app.bsky.feed.post", "text": "hi", "createdAt": "2026-01-01T00:00:00Z"}
	// Writes alternate until a hint has been used: both nodes then cache
	// the tree and know each other (a node learns of one that started
	// after it at its next read of the peers, or when its first hint
	// arrives).
	start := testutil.ToFloat64(metrics.RepoHints.WithLabelValues("applied"))
	nodes := []*liveServer{a, b}
	i := 0
	for ; testutil.ToFloat64(metrics.RepoHints.WithLabelValues("applied")) == start; i++ {
		require.Less(t, i, 200, "no hint was ever used")
		nodes[i%2].createRecord(t, token, acct.DID, "app.bsky.feed.post", post)
	}
	// From here each write goes to the node that did not write last.
	applied := testutil.ToFloat64(metrics.RepoHints.WithLabelValues("applied"))
	const writes = 12
	for range writes {
		s := nodes[i%2]
		i++
		s.createRecord(t, token, acct.DID, "app.bsky.feed.post", post)
		require.Equal(t, latestRev(t, a, acct.DID), latestRev(t, b, acct.DID))
	}
	got := testutil.ToFloat64(metrics.RepoHints.WithLabelValues("applied")) - applied
	require.GreaterOrEqual(t, got, float64(writes), "cached trees caught up from hints (datagrams sent %v, received %v, refused %v; hints kept %v, uncached %v)",
		testutil.ToFloat64(metrics.ClusterHintDatagrams.WithLabelValues("sent")), testutil.ToFloat64(metrics.ClusterHintDatagrams.WithLabelValues("received")),
		testutil.ToFloat64(metrics.ClusterHintDatagrams.WithLabelValues("refused")), testutil.ToFloat64(metrics.RepoHints.WithLabelValues("kept")),
		testutil.ToFloat64(metrics.RepoHints.WithLabelValues("uncached")))
}

// TestServeHintPortInUseLeavesTheCluster: a node whose hint address is
// taken stops at start saying so, and does not stay counted as a running
// node of the cluster (its row is marked stopped).
func TestServeHintPortInUseLeavesTheCluster(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.NewURL(t)
	_, plc := plctest.NewServer(t)
	sec := newClusterSecrets(t)
	taken, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer taken.Close()
	log := refusedServe(t, append([]string{"--database-url", dbURL, "--hostname", "localhost:" + strconv.Itoa(freePort(t)),
		"--plc-url", plc.URL, "--data-dir", t.TempDir(), "--cluster-hint-addr", taken.LocalAddr().String()}, sec.flags()...))
	require.Contains(t, log, "address already in use")
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var running int
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT count(*) FROM cluster_nodes WHERE node <> '' AND stopped_at IS NULL").Scan(&running))
	require.Zero(t, running, "the node that failed to start still counts as running")
}
