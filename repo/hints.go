package repo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/ipfs/go-cid"
)

// Commit hints. Behind a round-robin balancer an account's next write
// usually reaches another node than its last, whose cached tree is then a
// commit behind: without more, that node asks the database what moved
// first (bulwark_repo_since, a round trip and a statement per commit) or
// has its commit refused. With hints, each node tells the others, right
// after a commit, what the commit did: the repository's previous and new
// commit, the new MST root and rev, and each operation's path and record
// CID (cluster/hints.go carries them). A node keeps the hints of the
// repositories it caches, and its next commit to one applies them to the
// cached tree first (replay, refresh.go): when that makes the new root the
// hint names, the tree is current and the commit goes out in one round
// trip, without the read.
//
// A hint is never trusted: the tree it builds must have the root CID it
// names, and the commit built on it is stored only if the database's
// root is the one the tree was built from (bulwark_try_commit). A lost,
// late or wrong hint costs what no hint costs: the commit is refused with
// what moved, caught up and built again.

// HintSender sends a hint's payload to the other nodes, or reports that
// it is too large to send; Poll hands the hints already received to
// ReceiveHint before it returns.
type HintSender interface {
	Send(payload []byte) (fits bool)
	Poll()
}

const (
	hintVersion = 1
	// hintFlagNoOps marks a hint of a commit whose operations did not fit
	// in what the sender sends: the node learns only that it moved.
	hintFlagNoOps = 1
	// maxHintedRepos bounds the repositories with hints kept, and
	// maxHintsPerRepo the hints kept of one: a repository that other
	// nodes commit to that often without this one writing to it is
	// written elsewhere, and its cached tree is dropped with its hints.
	maxHintedRepos  = 4096
	maxHintsPerRepo = 8
	// hintTTL is how long a hint is kept unused.
	hintTTL = time.Minute
	// maxHintOps bounds a hint's operations; a commit with more is
	// hinted without them.
	maxHintOps = 32
	// hintsAfterMove is how many of its next commits to a repository a
	// process hints to the others once it finds another node writing to
	// it (a refresh, a hint applied); each such finding starts the count
	// afresh. Behind a round-robin balancer that is every commit; where
	// each repository stays on one node, none.
	hintsAfterMove = 8
)

// hint is one commit another node made.
type hint struct {
	prev, commit, data cid.Cid
	rev                string
	// ops are the commit's operations, none when noOps.
	ops   []sinceRecord
	noOps bool
	at    time.Time
}

// hintBook keeps the hints of the repositories this node caches.
type hintBook struct {
	mu    sync.Mutex
	byDID map[string][]*hint
}

// SetHintSender makes the engine send hints of the commits it stores to
// s (nil: none): of each commit to a repository another node has lately
// written to as well.
func (e *Engine) SetHintSender(s HintSender) {
	if s == nil {
		e.hintSender.Store(nil)
		return
	}
	e.hintSender.Store(&s)
}

// ReceiveHint keeps another node's hint, if this node caches the
// repository it is about (or is writing to it now) and has neither the
// hint's commit nor the hint already. It does not block.
func (e *Engine) ReceiveHint(payload []byte) {
	did, h, err := decodeHint(payload)
	if err != nil {
		e.counters.hints.WithLabelValues("malformed").Inc()
		return
	}
	rev, cached := e.cache.revOf(did)
	if !cached && !e.isWriting(did) {
		e.counters.hints.WithLabelValues("uncached").Inc()
		return
	}
	if cached && h.rev <= rev {
		// Of a commit the cached tree has (a datagram sent again).
		e.counters.hints.WithLabelValues("old").Inc()
		return
	}
	h.at = time.Now()
	e.hints.mu.Lock()
	defer e.hints.mu.Unlock()
	for _, k := range e.hints.byDID[did] {
		if k.commit.Equals(h.commit) {
			e.counters.hints.WithLabelValues("duplicate").Inc()
			return
		}
	}
	if e.hints.byDID == nil || len(e.hints.byDID) >= maxHintedRepos {
		// Crude but bounded: the hints of repositories not written to
		// since are the ones lost; a node has few in flight.
		e.hints.byDID = make(map[string][]*hint)
	}
	hs := append(e.hints.byDID[did], h)
	if len(hs) > maxHintsPerRepo {
		delete(e.hints.byDID, did)
		e.cache.drop(did)
		e.counters.hints.WithLabelValues("dropped").Inc()
		return
	}
	e.hints.byDID[did] = hs
	e.counters.hints.WithLabelValues("kept").Inc()
}

// pollHints reads the hints that have arrived but were not yet handed on.
func (e *Engine) pollHints() {
	if p := e.hintSender.Load(); p != nil {
		(*p).Poll()
	}
}

// takeHints removes and returns did's hints.
func (e *Engine) takeHints(did string) []*hint {
	e.hints.mu.Lock()
	defer e.hints.mu.Unlock()
	hs := e.hints.byDID[did]
	delete(e.hints.byDID, did)
	return hs
}

// isWriting reports whether a writer of did is in or waiting.
func (e *Engine) isWriting(did string) bool {
	e.writersMu.Lock()
	defer e.writersMu.Unlock()
	return e.writers[did] != nil
}

// followHints brings st up to the newest commit its hints chain to from
// st's commit. When that leaves no hint of a newer commit, st is current
// as far as the hints tell, and its next commit is worked out without
// asking the database first; when a hint says the repository moved past
// st but the chain stops short (a hint lost, or one without operations),
// the commit asks first. On an error st is torn.
func (e *Engine) followHints(ctx context.Context, st *repoState) {
	if st.shared > 0 {
		st.shared--
	}
	hs := e.takeHints(st.did)
	if len(hs) == 0 {
		return
	}
	now := time.Now()
	live := hs[:0]
	for _, h := range hs {
		if now.Sub(h.at) <= hintTTL && h.rev > st.rev {
			live = append(live, h)
		}
	}
	if len(live) == 0 {
		return
	}
	var chain []*hint
	for cur := st.commit; len(chain) < len(live); {
		var next *hint
		for _, h := range live {
			if h.prev.Equals(cur) && !h.noOps {
				next = h
				break
			}
		}
		if next == nil {
			break
		}
		chain = append(chain, next)
		cur = next.commit
	}
	if len(chain) > 0 {
		last := chain[len(chain)-1]
		m := &movedRoot{commit: last.commit, data: last.data, rev: last.rev}
		for _, h := range chain {
			m.records = append(m.records, h.ops...)
		}
		ok, err := st.replay(ctx, m)
		if err != nil {
			st.torn = true
			return
		}
		if ok {
			e.counters.hints.WithLabelValues("applied").Inc()
			st.shared = hintsAfterMove
		}
	}
	for _, h := range live {
		if h.rev > st.rev {
			// Moved past what the hints could build: ask first.
			st.checks = max(st.checks, 1)
			return
		}
	}
	st.checks = 0
}

// sendHint tells the other nodes about a commit stored from prev.
func (e *Engine) sendHint(did string, res *CommitResult) {
	p := e.hintSender.Load()
	if p == nil || res.moved == nil {
		return
	}
	if !(*p).Send(encodeHint(did, res, false)) {
		(*p).Send(encodeHint(did, res, true))
	}
}

// movedFrom is what a stored commit changed, for its hint: the commit it
// followed, its signed commit block, and its operations.
type movedFrom struct {
	prev        cid.Cid
	commitBlock []byte
	ops         []*comatproto.SyncSubscribeRepos_RepoOp
}

// movedFrom is what a commit's hint needs, when one is sent: hints are on
// and another node has been found writing to the repository lately.
func (e *Engine) movedFrom(st *repoState, prev cid.Cid, commitBlock []byte, ops []*comatproto.SyncSubscribeRepos_RepoOp) *movedFrom {
	if st.shared == 0 || e.hintSender.Load() == nil {
		return nil
	}
	return &movedFrom{prev: prev, commitBlock: commitBlock, ops: ops}
}

// encodeHint is a hint's payload: a version and flags byte each, then
// length-prefixed (uvarint) the DID, the previous commit's CID and the
// signed commit block (whose CID is the commit's, and which names the MST
// root and the rev), then (unless noOps) the operation count and each
// operation's path and record CID (empty for a delete).
func encodeHint(did string, res *CommitResult, noOps bool) []byte {
	noOps = noOps || len(res.moved.ops) > maxHintOps
	var flags byte
	if noOps {
		flags = hintFlagNoOps
	}
	b := make([]byte, 0, 512)
	b = append(b, hintVersion, flags)
	b = appendField(b, []byte(did))
	b = appendField(b, res.moved.prev.Bytes())
	b = appendField(b, res.moved.commitBlock)
	if noOps {
		return b
	}
	b = binary.AppendUvarint(b, uint64(len(res.moved.ops)))
	for _, op := range res.moved.ops {
		b = appendField(b, []byte(op.Path))
		var c []byte
		if op.Cid != nil {
			c = cid.Cid(*op.Cid).Bytes()
		}
		b = appendField(b, c)
	}
	return b
}

func appendField(b, f []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	return append(b, f...)
}

var errBadHint = errors.New("malformed hint")

// hintReader reads encodeHint's fields.
type hintReader struct {
	b   []byte
	err error
}

func (r *hintReader) field() []byte {
	if r.err != nil {
		return nil
	}
	n, k := binary.Uvarint(r.b)
	if k <= 0 || n > uint64(len(r.b)-k) {
		r.err = errBadHint
		return nil
	}
	f := r.b[k : k+int(n)]
	r.b = r.b[k+int(n):]
	return f
}

func (r *hintReader) cid(optional bool) cid.Cid {
	f := r.field()
	if r.err != nil || (optional && len(f) == 0) {
		return cid.Undef
	}
	c, err := cid.Cast(f)
	if err != nil {
		r.err = errBadHint
	}
	return c
}

// decodeHint parses encodeHint's payload. The commit's CID, MST root and
// rev are read off the commit block, so a hint cannot name a commit CID
// with another tree: the CID is the block's hash.
func decodeHint(b []byte) (string, *hint, error) {
	if len(b) < 2 || b[0] != hintVersion || b[1]&^hintFlagNoOps != 0 {
		return "", nil, errBadHint
	}
	h := &hint{noOps: b[1]&hintFlagNoOps != 0}
	r := &hintReader{b: b[2:]}
	did := string(r.field())
	h.prev = r.cid(false)
	block := r.field()
	if r.err != nil || did == "" {
		return "", nil, errBadHint
	}
	var err error
	if h.commit, err = cidBuilder.Sum(block); err != nil {
		return "", nil, errBadHint
	}
	var c atrepo.Commit
	if c.UnmarshalCBOR(bytes.NewReader(block)) != nil || c.DID != did || !c.Data.Defined() || c.Rev == "" || h.prev.Equals(h.commit) {
		return "", nil, errBadHint
	}
	h.data, h.rev = c.Data, c.Rev
	if h.noOps {
		if len(r.b) != 0 {
			return "", nil, errBadHint
		}
		return did, h, nil
	}
	n, k := binary.Uvarint(r.b)
	if k <= 0 || n == 0 || n > maxHintOps {
		return "", nil, errBadHint
	}
	r.b = r.b[k:]
	h.ops = make([]sinceRecord, 0, n)
	for range n {
		path := string(r.field())
		c := r.cid(true)
		if r.err != nil || path == "" {
			return "", nil, errBadHint
		}
		h.ops = append(h.ops, sinceRecord{path: path, cid: c})
	}
	if len(r.b) != 0 {
		return "", nil, errBadHint
	}
	return did, h, nil
}
