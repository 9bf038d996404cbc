package pds

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/bluesky-social/indigo/events"
	"github.com/bluesky-social/indigo/events/schedulers/sequential"
	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// movePair is two servers, each with blobs on disk, a sequencer, a
// firehose and a consumer of that firehose, over one verifying PLC
// directory: the setting of a full account move.
type movePair struct {
	plc  *plctest.Directory
	dir  identity.Directory // resolves DIDs through the shared PLC directory
	a, b *moveServer
}

// moveServer is one server of a movePair and what its firehose carried.
type moveServer struct {
	*accountEnv
	name   string
	stream *moveStream
}

// newMovePair starts both servers and their consumers; everything stops
// when the test ends.
func newMovePair(t *testing.T) *movePair {
	t.Helper()
	p := &movePair{plc: plctest.New()}
	p.a = newMoveServer(t, "a", p.plc)
	p.b = newMoveServer(t, "b", p.plc)
	p.dir = &identity.BaseDirectory{PLCURL: p.a.plcURL, HTTPClient: *http.DefaultClient, SkipHandleVerification: true}
	return p
}

func newMoveServer(t *testing.T, name string, dir *plctest.Directory) *moveServer {
	t.Helper()
	return newMoveServerWith(t, name, dir, nil)
}

// newMoveServerWith is newMoveServer with more adjusted in its Options
// (nil: nothing).
func newMoveServerWith(t *testing.T, name string, dir *plctest.Directory, more func(*Options)) *moveServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	pool := dbtest.New(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub := firehose.NewHub(pool, firehose.Config{Logger: logger})
	wg.Go(func() { _ = hub.Run(ctx) })
	e := newAccountEnv(t, envOptions{plcHandler: dir, blobs: true, pool: pool, sequence: true, options: func(o *Options) {
		o.Firehose = hub
		if more != nil {
			more(o)
		}
	}})
	s := &moveServer{accountEnv: e, name: name, stream: &moveStream{events: make(chan moveEvent, 1024)}}
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(e.url, "http")+"/xrpc/com.atproto.sync.subscribeRepos", nil)
	require.NoError(t, err)
	cb := s.stream.callbacks(ctx)
	wg.Go(func() {
		_ = events.HandleRepoStream(ctx, conn, sequential.NewScheduler("move-"+name, cb.EventHandler), logger)
	})
	require.Eventually(t, func() bool { return hub.Live() == 1 }, 10*time.Second, time.Millisecond)
	return s
}

// moveEvent is one firehose event as a consumer of one server saw it.
type moveEvent struct {
	kind   string // identity, account, sync, commit
	did    string
	seq    int64
	active bool   // #account
	status string // #account
	handle string // #identity
	rev    string // #sync, #commit
	sync   *comatproto.SyncSubscribeRepos_Sync
	commit *comatproto.SyncSubscribeRepos_Commit
}

// moveStream passes on every event a consumer reads, in order.
type moveStream struct {
	events chan moveEvent
}

func (s *moveStream) callbacks(ctx context.Context) *events.RepoStreamCallbacks {
	send := func(e moveEvent) error {
		select {
		case s.events <- e:
		case <-ctx.Done():
		}
		return nil
	}
	return &events.RepoStreamCallbacks{
		RepoIdentity: func(e *comatproto.SyncSubscribeRepos_Identity) error {
			return send(moveEvent{kind: "identity", did: e.Did, seq: e.Seq, handle: deref(e.Handle)})
		},
		RepoAccount: func(e *comatproto.SyncSubscribeRepos_Account) error {
			return send(moveEvent{kind: "account", did: e.Did, seq: e.Seq, active: e.Active, status: deref(e.Status)})
		},
		RepoSync: func(e *comatproto.SyncSubscribeRepos_Sync) error {
			return send(moveEvent{kind: "sync", did: e.Did, seq: e.Seq, rev: e.Rev, sync: e})
		},
		RepoCommit: func(e *comatproto.SyncSubscribeRepos_Commit) error {
			return send(moveEvent{kind: "commit", did: e.Repo, seq: e.Seq, rev: e.Rev, commit: e})
		},
	}
}

// until reads did's events (others are skipped) until stop, given all
// read so far, says enough, and returns them.
func (s *moveStream) until(t *testing.T, did syntax.DID, stop func(seen []moveEvent) bool) []moveEvent {
	t.Helper()
	var seen []moveEvent
	timeout := time.After(30 * time.Second)
	for {
		select {
		case e := <-s.events:
			if e.did != did.String() {
				continue
			}
			seen = append(seen, e)
			if stop(seen) {
				return seen
			}
		case <-timeout:
			t.Fatalf("the firehose did not carry what was awaited for %s; saw %s", did, eventKinds(seen))
		}
	}
}

// kinds lists events as "kind" strings, "account(active)" for #account.
func eventKinds(evs []moveEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.kind
		if e.kind == "account" {
			out[i] += "(" + map[bool]string{true: "active", false: e.status}[e.active] + ")"
		}
	}
	return out
}

// activated is a stop for until: the #sync that follows an #account
// saying active, which ends activateAccount's announcement.
func activated(seen []moveEvent) bool {
	n := len(seen)
	return n >= 2 && seen[n-1].kind == "sync" && seen[n-2].kind == "account" && seen[n-2].active
}

// deactivated is a stop for until: an #account saying deactivated.
func deactivated(seen []moveEvent) bool {
	e := seen[len(seen)-1]
	return e.kind == "account" && !e.active && e.status == "deactivated"
}

// committed is a stop for until: a #commit.
func committed(seen []moveEvent) bool { return seen[len(seen)-1].kind == "commit" }
