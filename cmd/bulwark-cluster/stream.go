package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/events"
	"github.com/gorilla/websocket"
)

// frame is one firehose frame as a node sent it.
type frame struct {
	seq      int64
	kind     string
	raw      []byte
	at       time.Time
	did, rev string
	commit   *comatproto.SyncSubscribeRepos_Commit
}

// stream is one node's firehose, read from cursor 0 and resumed from the
// last seq after every disconnection (the node killed, frozen, restarted).
type stream struct {
	node *node

	mu         sync.Mutex
	frames     map[int64]*frame
	byRev      map[string]*frame // did + " " + rev of each #commit
	last       int64
	dupes      int // a seq sent again with the same bytes
	conflicts  int // a seq sent again with other bytes
	problems   []string
	reconnects int
	// ends counts the error frames the node ended a connection with, by
	// name; the stream resumes from its last seq after each.
	ends map[string]int
}

func newStream(n *node) *stream {
	return &stream{node: n, frames: map[int64]*frame{}, byRev: map[string]*frame{}, ends: map[string]int{}}
}

// run reads the firehose until ctx ends.
func (s *stream) run(ctx context.Context) {
	dialer := websocket.Dialer{HandshakeTimeout: 3 * time.Second}
	for ctx.Err() == nil {
		s.mu.Lock()
		cursor := s.last
		s.mu.Unlock()
		u := fmt.Sprintf("ws://127.0.0.1:%d/xrpc/com.atproto.sync.subscribeRepos?cursor=%d", s.node.port, cursor)
		conn, resp, err := dialer.DialContext(ctx, u, nil)
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		s.read(conn)
		stop()
		conn.Close()
		s.mu.Lock()
		s.reconnects++
		s.mu.Unlock()
	}
}

// read records frames until the connection ends.
func (s *stream) read(conn *websocket.Conn) {
	for {
		_, raw, err := conn.ReadMessage()
		if err != nil {
			return
		}
		at := time.Now()
		f, err := decodeFrame(raw)
		var end *errorFrame
		s.mu.Lock()
		switch {
		case errors.As(err, &end):
			s.ends[end.name]++
		case err != nil:
			s.problems = append(s.problems, err.Error())
		case f.seq == 0:
			// #info: nothing to record.
		case s.frames[f.seq] != nil:
			if bytes.Equal(s.frames[f.seq].raw, raw) {
				s.dupes++
			} else {
				s.conflicts++
			}
		default:
			f.at = at
			s.frames[f.seq] = f
			if f.commit != nil {
				s.byRev[f.did+" "+f.rev] = f
			}
			s.last = max(s.last, f.seq)
		}
		s.mu.Unlock()
	}
}

// errorFrame is an error frame a node sent before closing.
type errorFrame struct{ name, message string }

func (e *errorFrame) Error() string { return "error frame: " + e.name + " " + e.message }

// decodeFrame reads a frame's kind and seq (and a #commit whole).
func decodeFrame(raw []byte) (*frame, error) {
	r := bytes.NewReader(raw)
	var hdr events.EventHeader
	if err := hdr.UnmarshalCBOR(r); err != nil {
		return nil, fmt.Errorf("frame header: %w", err)
	}
	f := &frame{raw: raw, kind: hdr.MsgType}
	if hdr.Op != events.EvtKindMessage {
		var e events.ErrorFrame
		if err := e.UnmarshalCBOR(r); err != nil {
			return nil, fmt.Errorf("error frame: %w", err)
		}
		return nil, &errorFrame{name: e.Error, message: e.Message}
	}
	switch hdr.MsgType {
	case "#commit":
		var ev comatproto.SyncSubscribeRepos_Commit
		if err := ev.UnmarshalCBOR(r); err != nil {
			return nil, err
		}
		f.seq, f.did, f.rev, f.commit = ev.Seq, ev.Repo, ev.Rev, &ev
	case "#sync":
		var ev comatproto.SyncSubscribeRepos_Sync
		if err := ev.UnmarshalCBOR(r); err != nil {
			return nil, err
		}
		f.seq, f.did, f.rev = ev.Seq, ev.Did, ev.Rev
	case "#identity":
		var ev comatproto.SyncSubscribeRepos_Identity
		if err := ev.UnmarshalCBOR(r); err != nil {
			return nil, err
		}
		f.seq, f.did = ev.Seq, ev.Did
	case "#account":
		var ev comatproto.SyncSubscribeRepos_Account
		if err := ev.UnmarshalCBOR(r); err != nil {
			return nil, err
		}
		f.seq, f.did = ev.Seq, ev.Did
	}
	return f, nil
}

// lastSeq is the highest seq read.
func (s *stream) lastSeq() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// arrival is when did's commit at rev arrived (false: not yet).
func (s *stream) arrival(did, rev string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.byRev[did+" "+rev]
	if !ok {
		return time.Time{}, false
	}
	return f.at, true
}

// streamReport is what checkStreams found.
type streamReport struct {
	last     int64
	commits  int
	verified int
	problems []string
	// ends are the error frames each node ended connections with.
	ends []string
}

// checkStreams requires every stream to hold seqs 1..last with none
// missing or sent twice with other bytes, the same bytes for each seq on
// every node, and every #commit to verify (verify checks one).
func checkStreams(streams []*stream, last int64, verify func(*comatproto.SyncSubscribeRepos_Commit) error) streamReport {
	rep := streamReport{last: last}
	ref := streams[0]
	for _, s := range streams {
		s.mu.Lock()
		missing := 0
		for seq := int64(1); seq <= last; seq++ {
			if s.frames[seq] == nil {
				missing++
			}
		}
		if missing > 0 {
			rep.problems = append(rep.problems, fmt.Sprintf("%s: %d of seqs 1..%d missing", s.node.name, missing, last))
		}
		if s.conflicts > 0 {
			rep.problems = append(rep.problems, fmt.Sprintf("%s: %d seqs sent twice with different bytes", s.node.name, s.conflicts))
		}
		if s.dupes > 0 {
			rep.problems = append(rep.problems, fmt.Sprintf("%s: %d seqs sent twice", s.node.name, s.dupes))
		}
		if len(s.problems) > 0 {
			rep.problems = append(rep.problems, fmt.Sprintf("%s: %v", s.node.name, s.problems[:min(3, len(s.problems))]))
		}
		if len(s.ends) > 0 {
			rep.ends = append(rep.ends, fmt.Sprintf("%s %v", s.node.name, s.ends))
		}
		s.mu.Unlock()
	}
	ref.mu.Lock()
	seqs := make([]int64, 0, len(ref.frames))
	for seq := range ref.frames {
		seqs = append(seqs, seq)
	}
	ref.mu.Unlock()
	slices.Sort(seqs)
	differ := map[string]int{}
	for _, seq := range seqs {
		if seq > last {
			break
		}
		ref.mu.Lock()
		f := ref.frames[seq]
		ref.mu.Unlock()
		for _, s := range streams[1:] {
			s.mu.Lock()
			g := s.frames[seq]
			s.mu.Unlock()
			if g != nil && !bytes.Equal(f.raw, g.raw) {
				differ[s.node.name]++
			}
		}
		if f.commit != nil {
			rep.commits++
			if err := verify(f.commit); err != nil {
				rep.problems = append(rep.problems, "commit seq "+strconv.FormatInt(seq, 10)+" does not verify: "+err.Error())
			} else {
				rep.verified++
			}
		}
	}
	for name, n := range differ {
		rep.problems = append(rep.problems, fmt.Sprintf("%s: %d frames differ from %s's", name, n, ref.node.name))
	}
	return rep
}
