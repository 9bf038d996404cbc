package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/events"
	"github.com/gorilla/websocket"
)

// relayReadLimit is what relays read of one frame: above it they drop
// the connection.
const relayReadLimit = 5_000_000

// frameRelay is a relay as the watch sees one: it reads our firehose like
// indigo's relay at its worst (a frame over the read limit drops the
// connection, and it redials at once with the same cursor), and answers
// com.atproto.sync.getHostStatus with the last seq it read.
type frameRelay struct {
	*httptest.Server
	hostname string
	cursor   atomic.Int64
	dials    atomic.Int64
}

func newFrameRelay(t *testing.T, hostname string) *frameRelay {
	r := &frameRelay{hostname: hostname}
	r.Server = httptest.NewServer(http.HandlerFunc(r.hostStatus))
	t.Cleanup(r.Close)
	return r
}

func (r *frameRelay) hostStatus(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if req.URL.Path != "/xrpc/com.atproto.sync.getHostStatus" || req.URL.Query().Get("hostname") != r.hostname {
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":"HostNotFound","message":"host not found"}`))
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"hostname": r.hostname, "seq": r.cursor.Load(), "status": "active"})
}

// follow reads wsURL from cursor until the test ends.
func (r *frameRelay) follow(t *testing.T, wsURL string, cursor int64) {
	r.cursor.Store(cursor)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			r.dials.Add(1)
			if !r.read(ctx, wsURL) {
				// A refused dial: try again shortly, as relays do.
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// read follows one connection until it fails; it reports whether the dial
// worked.
func (r *frameRelay) read(ctx context.Context, wsURL string) bool {
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, fmt.Sprintf("%s?cursor=%d", wsURL, r.cursor.Load()), nil)
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetReadLimit(relayReadLimit)
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	for {
		_, msg, err := conn.ReadMessage()
		if err != nil {
			return true
		}
		rd := bytes.NewReader(msg)
		var hdr events.EventHeader
		if hdr.UnmarshalCBOR(rd) != nil || hdr.Op != 1 {
			return true
		}
		var seq int64
		switch hdr.MsgType {
		case "#commit":
			var c comatproto.SyncSubscribeRepos_Commit
			if c.UnmarshalCBOR(rd) == nil {
				seq = c.Seq
			}
		case "#sync":
			var s comatproto.SyncSubscribeRepos_Sync
			if s.UnmarshalCBOR(rd) == nil {
				seq = s.Seq
			}
		case "#identity":
			var i comatproto.SyncSubscribeRepos_Identity
			if i.UnmarshalCBOR(rd) == nil {
				seq = i.Seq
			}
		case "#account":
			var a comatproto.SyncSubscribeRepos_Account
			if a.UnmarshalCBOR(rd) == nil {
				seq = a.Seq
			}
		}
		if seq > r.cursor.Load() {
			r.cursor.Store(seq)
		}
	}
}
