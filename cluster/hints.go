package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/metrics"
)

// Hints are short datagrams a node sends the other nodes after each
// commit, over UDP, so that their cached trees of the repository follow
// without asking the database first (repo/hints.go says what a hint holds
// and how it is used). They are only hints: a node that misses one, or
// gets a wrong one, learns the truth from the database when its next
// commit is refused, as it would with no hints at all; so a hint is sent
// once, never acknowledged, and lost ones are not noticed.
//
// Each datagram is authenticated: HMAC-SHA256 with a key of its own
// purpose derived from the shared JWT secret (every node has the same,
// which Join checks), over the payload and the time it was sent. A
// datagram is read only from an address some running node advertises
// (cluster_nodes.hint_addr), within MaxHintAge of being sent, with a
// valid tag; anything else is dropped before its payload is looked at,
// and counted.

const (
	// MaxHintPayload bounds a hint's payload: one datagram that fits a
	// common 1,500-byte MTU with its header and tag, so it is never
	// fragmented. A larger commit is hinted without its operations.
	MaxHintPayload = 1400
	// MaxHintAge is how old a datagram may be when it is read (the
	// nodes' clocks must agree within it, as NTP keeps them).
	MaxHintAge = 10 * time.Second
	// hintPeersEvery is how often the peers are read from the database,
	// and hintPeersSoonest how soon again when a datagram comes from an
	// address not among them (a node that has just started).
	hintPeersEvery   = 2 * time.Second
	hintPeersSoonest = 500 * time.Millisecond
	// hintDrainEvery is how often Run reads what has arrived.
	hintDrainEvery = 50 * time.Millisecond
	// hintReadBuffer is the socket's receive buffer asked for: room for
	// the hints of more than hintDrainEvery at thousands of commits a
	// second (the system may give less; a hint lost costs a refusal).
	hintReadBuffer = 4 << 20
	hintMagic      = "BWH1"
	hintHeader     = len(hintMagic) + 8
	hintTag        = sha256.Size
	// hintBuffer is Poll's read buffer, larger than any datagram
	// accepted, so a longer one is read whole and refused.
	hintBuffer = 64 << 10
)

// HintStats counts datagrams (also in metrics.ClusterHintDatagrams).
type HintStats struct {
	Sent, Received, Refused atomic.Int64
}

// count adds one to n and to the metric's outcome.
func (s *HintStats) count(n *atomic.Int64, outcome string) {
	n.Add(1)
	metrics.ClusterHintDatagrams.WithLabelValues(outcome).Inc()
}

// HintConfig configures a node's hints.
type HintConfig struct {
	// Addr is the UDP host:port the node reads hints on and advertises
	// to the others; it must be reachable from every node (a private
	// address: the port needs no exposure beyond the cluster).
	Addr string
	// Key authenticates the datagrams (the same on every node).
	Key []byte
	// Handle is called with each authenticated payload, on Run's
	// goroutine or a Poll caller's: it must not block, and must be safe
	// for concurrent use.
	Handle func(payload []byte)
	Logger *slog.Logger
}

// Hints sends and reads the hints of one node.
type Hints struct {
	cfg   HintConfig
	node  *Node
	conn  *net.UDPConn
	log   *slog.Logger
	Stats HintStats

	// peers are the other nodes' advertised addresses.
	peers atomic.Pointer[[]netip.AddrPort]
	// unknown asks the peer refresher to read the peers now.
	unknown chan struct{}
	// staleWarned is set once a stale datagram has been logged.
	staleWarned atomic.Bool
	// sendMu serialises sends' use of buf.
	sendMu sync.Mutex
	buf    []byte
	poll   pollFD
}

// ListenHints opens cfg.Addr for node n, records it as n's advertised
// address (a port 0 is the one the system picks) and returns the node's
// hints; call Run to read them and keep
// the peers current.
func ListenHints(ctx context.Context, n *Node, cfg HintConfig) (*Hints, error) {
	if len(cfg.Key) < 32 {
		return nil, errors.New("cluster hints: key shorter than 32 bytes")
	}
	ap, err := netip.ParseAddrPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("cluster hints: address %q: want ip:port (%v)", cfg.Addr, err)
	}
	if ap.Addr().IsUnspecified() {
		return nil, fmt.Errorf("cluster hints: address %q: the other nodes send to it, so it needs this node's own IP", cfg.Addr)
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return nil, fmt.Errorf("cluster hints: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	_ = conn.SetReadBuffer(hintReadBuffer)
	h := &Hints{cfg: cfg, node: n, conn: conn, log: cfg.Logger.With("component", "cluster-hints"), unknown: make(chan struct{}, 1),
		buf: make([]byte, 0, hintHeader+MaxHintPayload+hintTag)}
	h.peers.Store(&[]netip.AddrPort{})
	if err := h.openPollFD(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("cluster hints: %w", err)
	}
	// Port 0 (tests) is the port the system chose.
	ap = conn.LocalAddr().(*net.UDPAddr).AddrPort()
	if _, err := n.pool.Exec(ctx, qSetHintAddr, int(n.ClockID()), n.cfg.ID, ap.String()); err != nil {
		h.Close()
		return nil, fmt.Errorf("cluster hints: advertising %s: %w", ap, db.Translate(err))
	}
	if err := h.refreshPeers(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Close closes the socket and Poll's descriptor (Run does when it ends).
func (h *Hints) Close() {
	h.conn.Close()
	h.closePollFD()
}

// Send sends payload to every other running node, unless it is larger
// than MaxHintPayload: it then reports that it does not fit.
func (h *Hints) Send(payload []byte) (fits bool) {
	if len(payload) > MaxHintPayload {
		return false
	}
	peers := *h.peers.Load()
	if len(peers) == 0 {
		return true
	}
	h.sendMu.Lock()
	defer h.sendMu.Unlock()
	msg := sealHint(h.buf[:0], h.cfg.Key, time.Now(), payload)
	for _, p := range peers {
		// A full socket buffer or an unreachable peer loses the hint,
		// which is allowed.
		if _, err := h.conn.WriteToUDPAddrPort(msg, p); err == nil {
			h.Stats.count(&h.Stats.Sent, "sent")
		}
	}
	return true
}

// Run drains the socket every hintDrainEvery and refreshes the peers
// until ctx ends; it closes the socket then. Hints are read in batches,
// not as each arrives: a writer reads the ones it needs itself (Poll)
// before it commits, and the batches only keep the socket's buffer from
// filling with hints of repositories this node does not write, at a few
// wake-ups a second instead of one per commit of every other node.
func (h *Hints) Run(ctx context.Context) error {
	defer h.Close()
	peers := time.NewTicker(hintPeersEvery)
	defer peers.Stop()
	drain := time.NewTicker(hintDrainEvery)
	defer drain.Stop()
	var soonest time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-drain.C:
			h.Poll()
			continue
		case <-peers.C:
		case <-h.unknown:
			// However many datagrams from strangers arrive, the peers
			// are read at most this often.
			if time.Now().Before(soonest) {
				continue
			}
		}
		soonest = time.Now().Add(hintPeersSoonest)
		if err := h.refreshPeers(ctx); err != nil && ctx.Err() == nil {
			h.log.Debug("reading the hint peers", "err", err)
		}
	}
}

// handle checks one datagram and hands its payload on.
func (h *Hints) handle(from netip.AddrPort, msg []byte) {
	payload, why := h.open(from, msg, time.Now())
	if why != "" {
		h.Stats.count(&h.Stats.Refused, why)
		if why == refusedStale && h.staleWarned.CompareAndSwap(false, true) {
			// Once per process: a valid datagram from a running node,
			// but too old or too new. Hints are lost while it lasts.
			h.log.Warn("a node's commit hints arrive outside the 10 s window: are the nodes' clocks in sync (NTP)?", "from", from)
		}
		return
	}
	h.Stats.count(&h.Stats.Received, "received")
	if h.cfg.Handle != nil {
		h.cfg.Handle(payload)
	}
}

// Why a datagram was refused (the outcome label of
// metrics.ClusterHintDatagrams).
const (
	refusedNotPeer = "not_peer" // not from a running node's address
	refusedBadTag  = "bad_tag"  // malformed, or not tagged with the key
	refusedStale   = "stale"    // tagged, but sent outside MaxHintAge
)

// open checks a datagram from from and returns its payload, or why it is
// refused.
func (h *Hints) open(from netip.AddrPort, msg []byte, now time.Time) ([]byte, string) {
	if !h.isPeer(from.Addr()) {
		// Perhaps a node that started since the peers were read.
		select {
		case h.unknown <- struct{}{}:
		default:
		}
		return nil, refusedNotPeer
	}
	return openHint(h.cfg.Key, msg, now)
}

// isPeer reports whether addr is a running node's advertised address.
func (h *Hints) isPeer(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range *h.peers.Load() {
		if p.Addr().Unmap() == addr {
			return true
		}
	}
	return false
}

// refreshPeers reads the other running nodes' addresses.
func (h *Hints) refreshPeers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, hintPeersEvery)
	defer cancel()
	rows, err := h.node.pool.Query(ctx, qHintPeers, int(h.node.ClockID()), liveWindow.Seconds())
	if err != nil {
		return fmt.Errorf("cluster hints: reading peers: %w", db.Translate(err))
	}
	defer rows.Close()
	peers := []netip.AddrPort{}
	self := h.conn.LocalAddr().(*net.UDPAddr).AddrPort()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return fmt.Errorf("cluster hints: reading peers: %w", db.Translate(err))
		}
		ap, err := netip.ParseAddrPort(s)
		if err != nil || ap == self {
			continue
		}
		peers = append(peers, ap)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cluster hints: reading peers: %w", db.Translate(err))
	}
	h.peers.Store(&peers)
	return nil
}

// Peers is how many other nodes hints are sent to.
func (h *Hints) Peers() int { return len(*h.peers.Load()) }

// sealHint appends to dst the datagram of payload sent at now: the magic,
// the time in Unix milliseconds, the payload and the tag over all three.
func sealHint(dst, key []byte, now time.Time, payload []byte) []byte {
	dst = append(dst, hintMagic...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(now.UnixMilli()))
	dst = append(dst, payload...)
	m := hmac.New(sha256.New, key)
	m.Write(dst)
	return m.Sum(dst)
}

// openHint checks a datagram's magic, tag and age and returns its payload,
// or why it is refused.
func openHint(key, msg []byte, now time.Time) ([]byte, string) {
	if len(msg) < hintHeader+hintTag || len(msg) > hintHeader+MaxHintPayload+hintTag || string(msg[:len(hintMagic)]) != hintMagic {
		return nil, refusedBadTag
	}
	body, tag := msg[:len(msg)-hintTag], msg[len(msg)-hintTag:]
	m := hmac.New(sha256.New, key)
	m.Write(body)
	if !hmac.Equal(m.Sum(nil), tag) {
		return nil, refusedBadTag
	}
	sent := time.UnixMilli(int64(binary.BigEndian.Uint64(msg[len(hintMagic):hintHeader])))
	if age := now.Sub(sent); age > MaxHintAge || age < -MaxHintAge {
		return nil, refusedStale
	}
	return body[hintHeader:], ""
}
