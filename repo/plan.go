package repo

import (
	"bytes"
	"context"
	"fmt"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/limits"
)

// commitPlan is a commit worked out from a repo state: its result, the
// parameters that store it (nil when nothing changes), the records' blob
// references, finish, which brings the state up to the new commit once
// it is stored, and undo, which puts the state's tree back where it was
// when the commit is not stored.
type commitPlan struct {
	res         *CommitResult
	params      *commitParams
	blobChanges []RecordBlobs
	finish      func()
	undo        func() error
}

// plan applies writes to st's tree and builds everything the commit stores,
// checking every limit. It does no I/O; st.tree is mutated, so st may go
// back into the cache only once the commit is stored, or once the plan is
// undone. A plan that fails leaves the tree as it found it (or st torn,
// if it could not).
func (e *Engine) plan(ctx context.Context, st *repoState, did syntax.DID, key atcrypto.PrivateKey, writes []preparedWrite) (_ *commitPlan, err error) {
	oldCommit, oldData, oldRev := st.commit, st.data, st.rev
	applied, err := st.applyOps(writes)
	if err != nil {
		return nil, err
	}
	undo := func() error { return st.undoOps(applied.done, oldData) }
	if len(applied.ops) == 0 {
		return &commitPlan{res: &CommitResult{Commit: oldCommit, Rev: oldRev, Results: applied.results}, undo: undo}, nil
	}
	defer func() {
		if err != nil {
			_ = undo()
		}
	}()
	// The diff is written before the root is asked for: asking for the
	// root clears the tree's dirty flags, after which WriteDiffBlocks
	// would write nothing.
	diff := newDiffCollector()
	root, err := st.tree.WriteDiffBlocks(ctx, diff)
	if err != nil {
		return nil, fmt.Errorf("writing MST diff: %w", err)
	}
	rev := e.nextRev(oldRev)
	e.counters.plans.Inc()
	commitCID, commitBytes, err := signCommit(did, *root, rev, key)
	if err != nil {
		return nil, err
	}
	car, err := buildDiffCAR(commitCID, commitBytes, applied.upserts, diff, st.nodes)
	if err != nil {
		return nil, err
	}
	ev, err := commitEvent(did, commitCID, rev, oldRev, oldData, car.bytes, applied.ops)
	if err != nil {
		return nil, err
	}
	removed, newKids, err := st.removedNodes(oldData, diff)
	if err != nil {
		return nil, err
	}
	params := &commitParams{
		did: did.String(), oldCommit: oldCommit.Bytes(), commit: commitCID.Bytes(), commitBlock: commitBytes,
		data: root.Bytes(), rev: rev, removedNodes: cidBytes(removed),
		nodeCIDs: car.nodeCIDs, nodeData: car.nodeData, event: ev,
	}
	params.addRecords(applied.upserts, applied.deletes)
	return &commitPlan{
		res:         &CommitResult{Commit: commitCID, Rev: rev, Results: applied.results, moved: e.movedFrom(st, oldCommit, commitBytes, applied.ops)},
		params:      params,
		blobChanges: e.blobChanges(applied),
		finish:      func() { st.advance(removed, newKids, diff, *root, commitCID, rev) },
		undo:        undo,
	}, nil
}

// appliedOps is what applying a commit's writes to the tree produced.
type appliedOps struct {
	// ops are the commit's operations as the #commit event lists them
	// (writes that change nothing have none).
	ops     []*comatproto.SyncSubscribeRepos_RepoOp
	results []WriteResult
	// upserts and deletes are the records to store and to drop.
	upserts, deletes []preparedWrite
	// created holds the paths that had no record before this commit.
	created map[string]bool
	// done is every change made to the tree, in order, for undoOps.
	done []*atrepo.Operation
}

// applyOps applies writes to st's tree, checking each against the record
// it replaces (existence, swapRecord). When one is refused, the tree is
// put back as it was.
func (st *repoState) applyOps(writes []preparedWrite) (*appliedOps, error) {
	a := &appliedOps{results: make([]WriteResult, 0, len(writes)), created: make(map[string]bool, len(writes))}
	data := st.data
	for _, w := range writes {
		if err := a.apply(st.tree, w); err != nil {
			_ = st.undoOps(a.done, data)
			return nil, err
		}
	}
	return a, nil
}

// apply applies one write.
func (a *appliedOps) apply(tree *mst.Tree, w preparedWrite) error {
	var val *cid.Cid
	if w.Action != ActionDelete {
		c := w.cid
		val = &c
	}
	op, err := atrepo.ApplyOp(tree, w.path, val)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalidWrite, w.path, err)
	}
	a.done = append(a.done, op)
	if w.SwapRecord != nil && !sameCID(w.SwapRecord.CID, op.Prev) {
		return fmt.Errorf("%w: record %s is %s, not %s", ErrInvalidSwap, w.path, cidString(op.Prev), cidString(w.SwapRecord.CID))
	}
	res := WriteResult{Action: w.Action, Collection: w.Collection, RKey: w.RKey, CID: w.cid}
	switch {
	case w.Action == ActionCreate && op.Prev != nil:
		return fmt.Errorf("%w: %s", ErrRecordExists, w.path)
	case w.Action == ActionDelete && op.Prev == nil:
		return fmt.Errorf("%w: %s", ErrRecordNotFound, w.path)
	case w.Action == ActionUpdate && op.Prev == nil:
		// putRecord on a missing record creates it.
		res.Action = ActionCreate
	case w.Action == ActionUpdate && op.Prev.Equals(w.cid):
		// Identical record: no operation to report.
		a.results = append(a.results, res)
		return nil
	}
	a.results = append(a.results, res)
	if res.Action == ActionCreate {
		a.created[w.path] = true
	}
	a.ops = append(a.ops, repoOp(res.Action, w.path, val, op.Prev))
	if w.Action == ActionDelete {
		a.deletes = append(a.deletes, w)
	} else {
		a.upserts = append(a.upserts, w)
	}
	return nil
}

// undoOps reverts done on st's tree, newest first, and checks that the
// tree is back at root (a tree's shape follows from its keys alone, so
// reverting the changes restores the very nodes). If it is not, st is
// marked torn: it must not be used again.
func (st *repoState) undoOps(done []*atrepo.Operation, root cid.Cid) error {
	err := func() error {
		for i := len(done) - 1; i >= 0; i-- {
			if _, err := atrepo.ApplyOp(st.tree, done[i].Path, done[i].Prev); err != nil {
				return err
			}
		}
		got, err := st.tree.RootCID()
		if err != nil {
			return err
		}
		if !got.Equals(root) {
			return fmt.Errorf("root %s, not %s", got, root)
		}
		return nil
	}()
	if err != nil {
		st.torn = true
		return fmt.Errorf("%w: undoing a commit on the cached tree: %v", ErrCorruptRepo, err)
	}
	return nil
}

// repoOp is one operation as a #commit lists it.
func repoOp(action Action, path string, val, prev *cid.Cid) *comatproto.SyncSubscribeRepos_RepoOp {
	op := &comatproto.SyncSubscribeRepos_RepoOp{Action: string(action), Path: path}
	if val != nil {
		l := lexutil.LexLink(*val)
		op.Cid = &l
	}
	if prev != nil {
		l := lexutil.LexLink(*prev)
		op.Prev = &l
	}
	return op
}

// signCommit builds did's commit of the tree rooted at data, signs it with
// key, and returns its CID and encoded block.
func signCommit(did syntax.DID, data cid.Cid, rev string, key atcrypto.PrivateKey) (cid.Cid, []byte, error) {
	commit := atrepo.Commit{DID: did.String(), Version: atrepo.ATPROTO_REPO_VERSION, Data: data, Rev: rev}
	if err := commit.Sign(key); err != nil {
		return cid.Undef, nil, fmt.Errorf("signing commit: %w", err)
	}
	var buf bytes.Buffer
	if err := commit.MarshalCBOR(&buf); err != nil {
		return cid.Undef, nil, fmt.Errorf("encoding commit: %w", err)
	}
	c, err := cidBuilder.Sum(buf.Bytes())
	if err != nil {
		return cid.Undef, nil, err
	}
	return c, buf.Bytes(), nil
}

// diffCAR is the CAR relays receive for a commit, and the MST nodes of it
// that are not stored yet.
type diffCAR struct {
	bytes              []byte
	nodeCIDs, nodeData [][]byte
}

// buildDiffCAR assembles the commit's CAR (commit, new records, then MST
// nodes: the new ones and the unchanged neighbours the MST marks as proof)
// and checks it against the commit-blocks limit. stored are the nodes the
// database holds already.
func buildDiffCAR(commitCID cid.Cid, commitBytes []byte, upserts []preparedWrite, diff *diffCollector, stored nodeSource) (*diffCAR, error) {
	car := newCARBuilder(commitCID)
	car.add(commitCID, commitBytes)
	recordBytes := 0
	for _, w := range upserts {
		if car.add(w.cid, w.block) {
			recordBytes += len(w.block)
		}
	}
	out := &diffCAR{nodeCIDs: make([][]byte, 0, len(diff.blocks)), nodeData: make([][]byte, 0, len(diff.blocks))}
	for _, b := range diff.blocks {
		car.add(b.Cid(), b.RawData())
		if _, ok := stored[b.Cid()]; ok {
			// Rewritten unchanged (~6% of diff nodes): it is in the CAR
			// relays receive, and already in the database.
			continue
		}
		out.nodeCIDs = append(out.nodeCIDs, b.Cid().Bytes())
		out.nodeData = append(out.nodeData, b.RawData())
	}
	out.bytes = car.bytes()
	if len(out.bytes) > limits.MaxCommitBlocksBytes {
		return nil, &LimitError{
			Limit: LimitCommitBlocks, Size: len(out.bytes), Max: limits.MaxCommitBlocksBytes,
			Detail: fmt.Sprintf("%d records totalling %s bytes", len(upserts), commas(recordBytes)),
		}
	}
	return out, nil
}

// commitEvent encodes the commit's #commit event and checks its frame
// against the frame limit.
func commitEvent(did syntax.DID, commitCID cid.Cid, rev, since string, prevData cid.Cid, car []byte, ops []*comatproto.SyncSubscribeRepos_RepoOp) (*eventlog.Encoded, error) {
	prev := lexutil.LexLink(prevData)
	ev, err := eventlog.EncodeCommit(&comatproto.SyncSubscribeRepos_Commit{
		Repo:     did.String(),
		Commit:   lexutil.LexLink(commitCID),
		Rev:      rev,
		Since:    &since,
		Blocks:   car,
		Ops:      ops,
		Blobs:    []lexutil.LexLink{},
		Time:     syntax.DatetimeNow().String(),
		PrevData: &prev,
	})
	if err != nil {
		return nil, err
	}
	if ev.FrameSize() > limits.MaxFrameBytes {
		return nil, &LimitError{Limit: LimitFrame, Size: ev.FrameSize(), Max: limits.MaxFrameBytes}
	}
	return ev, nil
}

// blobChanges lists the blobs each touched record references, for the
// blob tracker (nil without one).
func (e *Engine) blobChanges(a *appliedOps) []RecordBlobs {
	if e.blobs == nil {
		return nil
	}
	changes := make([]RecordBlobs, 0, len(a.upserts)+len(a.deletes))
	for _, w := range a.upserts {
		changes = append(changes, RecordBlobs{Collection: w.Collection, RKey: w.RKey, Blobs: atdata.ExtractBlobs(w.Record), Created: a.created[w.path]})
	}
	for _, w := range a.deletes {
		changes = append(changes, RecordBlobs{Collection: w.Collection, RKey: w.RKey})
	}
	return changes
}

func cidBytes(cids []cid.Cid) [][]byte {
	out := make([][]byte, len(cids))
	for i, c := range cids {
		out[i] = c.Bytes()
	}
	return out
}

func sameCID(a, b *cid.Cid) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equals(*b)
}

func cidString(c *cid.Cid) string {
	if c == nil {
		return "absent"
	}
	return c.String()
}
