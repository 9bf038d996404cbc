package cluster

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// joinForHints joins a node named id to pool's cluster.
func joinForHints(t *testing.T, ctx context.Context, pool *pgxpool.Pool, id string) *Node {
	t.Helper()
	n, err := Join(ctx, pool, NodeConfig{ID: id, Facts: secretFacts("jwt", "s3")})
	require.NoError(t, err)
	return n
}

// hintNode is a joined node with its hints running; got receives what
// its handler is given.
type hintNode struct {
	node  *Node
	hints *Hints
	got   chan []byte
}

func startHintNode(t *testing.T, ctx context.Context, n *Node, key []byte) *hintNode {
	t.Helper()
	hn := &hintNode{node: n, got: make(chan []byte, 16)}
	h, err := ListenHints(ctx, n, HintConfig{Addr: "127.0.0.1:0", Key: key, Handle: func(p []byte) {
		hn.got <- append([]byte(nil), p...)
	}})
	require.NoError(t, err)
	hn.hints = h
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return hn
}

func (hn *hintNode) addr() netip.AddrPort { return hn.hints.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// waitRefused waits until hn has refused want datagrams in all.
func (hn *hintNode) waitRefused(t *testing.T, want int64) {
	t.Helper()
	require.Eventually(t, func() bool { return hn.hints.Stats.Refused.Load() >= want }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, want, hn.hints.Stats.Refused.Load())
}

// TestHintsReachPeersOnly: a hint one node sends reaches the other
// running nodes' handlers, and nothing else does: not a datagram from an
// address no running node advertises (even with a good tag), one with a
// bad tag, one with another key, nor one sent too long ago. A stopped
// node is no longer sent to.
func TestHintsReachPeersOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pool := dbtest.New(t)
	key := bytes.Repeat([]byte{7}, 32)
	join := func(id string) *Node { return joinForHints(t, ctx, pool, id) }
	a := startHintNode(t, ctx, join("a"), key)
	b := startHintNode(t, ctx, join("b"), key)
	// a joined before b: it learns of b at its next refresh.
	require.NoError(t, a.hints.refreshPeers(ctx))
	require.Equal(t, 1, a.hints.Peers())
	require.Equal(t, 1, b.hints.Peers())
	// Poll does not wait behind the reading goroutine's wait.
	pollDone := make(chan struct{})
	go func() { b.hints.Poll(); close(pollDone) }()
	select {
	case <-pollDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Poll waited for a datagram")
	}

	a.hints.Send([]byte("commit one"))
	select {
	case got := <-b.got:
		require.Equal(t, "commit one", string(got))
	case <-time.After(10 * time.Second):
		t.Fatal("the hint did not arrive")
	}

	// A stranger with the right key, from an address no node advertises.
	stranger, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	require.NoError(t, err)
	defer stranger.Close()
	_, err = stranger.WriteToUDPAddrPort(sealHint(nil, key, time.Now(), []byte("forged")), b.addr())
	require.NoError(t, err)
	b.waitRefused(t, 1)

	// From a's own socket: a bad tag, another key, too old, too long.
	good := sealHint(nil, key, time.Now(), []byte("x"))
	badTag := append([]byte(nil), good...)
	badTag[len(badTag)-1] ^= 1
	for i, msg := range [][]byte{
		badTag,
		sealHint(nil, bytes.Repeat([]byte{8}, 32), time.Now(), []byte("other key")),
		sealHint(nil, key, time.Now().Add(-2*MaxHintAge), []byte("old")),
		sealHint(nil, key, time.Now(), make([]byte, MaxHintPayload+1)),
		good[:10],
	} {
		_, err := a.hints.conn.WriteToUDPAddrPort(msg, b.addr())
		require.NoError(t, err)
		b.waitRefused(t, int64(2+i))
	}
	select {
	case got := <-b.got:
		t.Fatalf("a refused datagram reached the handler: %q", got)
	default:
	}

	// b stops: a stops sending to it.
	b.node.Leave()
	require.NoError(t, a.hints.refreshPeers(ctx))
	require.Zero(t, a.hints.Peers())
}

// TestHintSealOpen: a sealed hint opens to its payload with the key it
// was sealed with, within MaxHintAge, and not otherwise.
func TestHintSealOpen(t *testing.T) {
	t.Parallel()
	key := bytes.Repeat([]byte{1}, 32)
	now := time.Now()
	msg := sealHint(nil, key, now, []byte("payload"))
	p, why := openHint(key, msg, now.Add(time.Second))
	require.Empty(t, why)
	require.Equal(t, "payload", string(p))
	_, why = openHint(key, msg, now.Add(MaxHintAge+time.Second))
	require.Equal(t, refusedStale, why, "too old")
	_, why = openHint(key, msg, now.Add(-MaxHintAge-time.Second))
	require.Equal(t, refusedStale, why, "from the future")
	_, why = openHint(bytes.Repeat([]byte{2}, 32), msg, now)
	require.Equal(t, refusedBadTag, why, "another key")
	for i := range msg {
		bad := append([]byte(nil), msg...)
		bad[i] ^= 0x40
		_, why := openHint(key, bad, now)
		require.Equal(t, refusedBadTag, why, "byte %d changed", i)
	}
}

// pollPair is two joined nodes' hints with no reading goroutine: a
// sends to b (it has read the peers), b hands what it reads to handle.
func pollPair(t *testing.T, handle func([]byte)) (a, b *Hints) {
	t.Helper()
	ctx := context.Background()
	pool := dbtest.New(t)
	key := bytes.Repeat([]byte{9}, 32)
	a, err := ListenHints(ctx, joinForHints(t, ctx, pool, "a"), HintConfig{Addr: "127.0.0.1:0", Key: key})
	require.NoError(t, err)
	t.Cleanup(a.Close)
	b, err = ListenHints(ctx, joinForHints(t, ctx, pool, "b"), HintConfig{Addr: "127.0.0.1:0", Key: key, Handle: handle})
	require.NoError(t, err)
	t.Cleanup(b.Close)
	require.NoError(t, a.refreshPeers(ctx))
	return a, b
}

// TestHintsPollReadsWaiting: Poll hands on every hint already waiting on
// the socket before it returns, with no reading goroutine running, and
// returns at once when none waits.
func TestHintsPollReadsWaiting(t *testing.T) {
	t.Parallel()
	var got []string
	a, b := pollPair(t, func(p []byte) { got = append(got, string(p)) })
	b.Poll()
	require.Empty(t, got)
	for _, p := range []string{"one", "two", "three"} {
		a.Send([]byte(p))
	}
	// Loopback queues a datagram on the receiving socket within sendto.
	b.Poll()
	require.Equal(t, []string{"one", "two", "three"}, got)
	require.Equal(t, int64(3), b.Stats.Received.Load())
}

// TestHintsPollWaitsForAPollInProgress: a datagram another Poll has taken
// off the socket but not yet handed on is waited for, so a writer's Poll
// never returns without a hint that had arrived before it was called.
func TestHintsPollWaitsForAPollInProgress(t *testing.T) {
	t.Parallel()
	inHandle, release := make(chan struct{}), make(chan struct{})
	var handed atomic.Int64
	a, b := pollPair(t, func([]byte) {
		close(inHandle)
		<-release
		handed.Add(1)
	})
	a.Send([]byte("one"))

	first := make(chan struct{})
	go func() { defer close(first); b.Poll() }() // as Run's drain would
	<-inHandle                                   // the datagram is off the socket, not yet handed on
	second, asked := make(chan int64), make(chan struct{})
	go func() {
		close(asked)
		b.Poll() // a writer's
		second <- handed.Load()
	}()
	<-asked
	close(release)
	require.EqualValues(t, 1, <-second, "a Poll returned before the hint another Poll had read was handed on")
	<-first
}
