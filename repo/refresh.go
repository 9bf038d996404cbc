package repo

import (
	"bytes"
	"context"
	"fmt"

	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/db"
)

// Catching up a cached tree. Several processes writing one repository (a
// cluster behind a round-robin balancer) each cache its tree; a commit
// built on a tree another process has moved on from would be refused.
// Reloading the whole tree costs a read of every node of the repository;
// instead the process brings its tree up to the stored root from what
// changed since its cached rev (a *refresh*), in one of two ways:
//
//   - the records written since (bulwark_repo_since, migrations/00034:
//     an index range scan, a row or two a commit behind), applied to the
//     tree as the commits that wrote them did. When every change since
//     was a create or an update, that makes the stored tree exactly, which
//     the stored root's CID confirms; a delete leaves no record to read,
//     the root then differs, and the changes are undone;
//   - then the MST nodes written since (bulwark_repo_nodes_since: found
//     from the root down, a few dozen primary-key probes): the tree is
//     rebuilt from them and from its own, the unchanged subtrees kept as
//     they are, only the new nodes decoded.
//
// If neither makes the stored tree (the repository was replaced, by an
// import or a deletion), the tree is loaded whole.
//
// A process learns that it must refresh in one of two ways. A commit
// built on the cached tree is refused, with bulwark_repo_since's answer,
// by bulwark_try_commit; the commit is then undone on the tree, the tree
// caught up and the commit rebuilt (at most maxRefreshes times). That
// costs the commit's work twice, so once a process has found a
// repository moved by another, its next commits to it ask first
// (bulwark_repo_since, one row read when nothing moved) and are worked
// out once, on a tree already caught up: see checksAfterMove.

// maxRefreshes is how many times a commit is rebuilt on a caught-up tree
// before it takes the locked path (the repository is being written
// through several processes at once).
const maxRefreshes = 3

// checksAfterMove is how many of a repository's next commits ask whether
// it moved before they are worked out, once one of its commits found that
// another process had moved it; each that finds it moved again starts the
// count afresh. Behind a round-robin balancer over N nodes a commit finds
// its repository unmoved one time in N, so the checks go on; once the
// writes stay on this node (affinity, or a quiet cluster), they stop
// after this many commits, and a lone node never makes one.
const checksAfterMove = 8

// movedRoot is the stored root a cached tree has fallen behind, and what
// changed since the cached rev: the records written (paths and CIDs), or
// the MST nodes written.
type movedRoot struct {
	commit, data cid.Cid
	rev          string
	records      []sinceRecord
	nodes        nodeSource
}

// sinceRecord is a record written after a cached rev (cid undefined: one
// deleted, which only a hint tells).
type sinceRecord struct {
	path string
	cid  cid.Cid
}

// parseMoved decodes bulwark_repo_since's answer (nodes false) or
// bulwark_repo_nodes_since's (nodes true): the commit CID, the MST root
// CID and the rev, then the records' paths and then their CIDs, or the
// new nodes' CIDs and then their blocks.
func parseMoved(raw [][]byte, nodes bool) (*movedRoot, error) {
	if len(raw) < 3 || (len(raw)-3)%2 != 0 {
		return nil, fmt.Errorf("%w: catching up: %d fields", ErrCorruptRepo, len(raw))
	}
	m := &movedRoot{rev: string(raw[2])}
	var err error
	if m.commit, err = cid.Cast(raw[0]); err != nil {
		return nil, fmt.Errorf("%w: commit cid: %v", ErrCorruptRepo, err)
	}
	if m.data, err = cid.Cast(raw[1]); err != nil {
		return nil, fmt.Errorf("%w: data cid: %v", ErrCorruptRepo, err)
	}
	n := (len(raw) - 3) / 2
	if nodes {
		m.nodes = make(nodeSource, n)
	} else {
		m.records = make([]sinceRecord, n)
	}
	for i := range n {
		first, second := raw[3+i], raw[3+n+i]
		if !nodes {
			c, err := cid.Cast(second)
			if err != nil {
				return nil, fmt.Errorf("%w: record cid: %v", ErrCorruptRepo, err)
			}
			m.records[i] = sinceRecord{path: string(first), cid: c}
			continue
		}
		c, err := cid.Cast(first)
		if err != nil {
			return nil, fmt.Errorf("%w: node cid: %v", ErrCorruptRepo, err)
		}
		m.nodes[c] = second
	}
	return m, nil
}

// refresh catches st up with moved, bulwark_repo_since's answer, reading
// the nodes written since through q when the records do not do it, and
// reports whether it could (otherwise st must not be used again).
func (e *Engine) refresh(ctx context.Context, q db.DBTX, st *repoState, moved [][]byte) bool {
	m, err := parseMoved(moved, false)
	if err != nil {
		return false
	}
	ok, err := st.replay(ctx, m)
	if err != nil {
		return false
	}
	if !ok {
		e.nodeWalks.Add(1)
		var raw [][]byte
		err := db.TranslateCall(q.QueryRow(ctx, qRepoNodesSince, st.did, st.commit.Bytes(), st.rev).Scan(&raw))
		if err != nil || raw == nil {
			return false
		}
		if m, err = parseMoved(raw, true); err != nil || st.catchUp(m) != nil {
			return false
		}
	}
	e.counters.refreshes.Inc()
	st.checks, st.shared = checksAfterMove, hintsAfterMove
	return true
}

// replay applies m's records to st's tree and reports whether that made
// the tree m's (the same root CID: every change since was a create or an
// update); st is then at m. If not, the records are undone and st is as
// it was; an error means st could not be put back.
func (st *repoState) replay(ctx context.Context, m *movedRoot) (bool, error) {
	if len(m.records) == 0 {
		return false, nil
	}
	oldData := st.data
	done := make([]*atrepo.Operation, 0, len(m.records))
	for _, r := range m.records {
		// A record CID is undefined for a delete (a hint's).
		var val *cid.Cid
		if r.cid.Defined() {
			c := r.cid
			val = &c
		}
		op, err := atrepo.ApplyOp(st.tree, r.path, val)
		if err != nil {
			return false, st.undoOps(done, oldData)
		}
		done = append(done, op)
	}
	diff := newDiffCollector()
	root, err := st.tree.WriteDiffBlocks(ctx, diff)
	if err != nil || !root.Equals(m.data) {
		return false, st.undoOps(done, oldData)
	}
	if len(diff.blocks) == 0 {
		// The records since left the tree as it was (a record updated and
		// then put back): no node changed, none is dropped.
		st.commit, st.rev = m.commit, m.rev
		return true, nil
	}
	removed, newKids, err := st.removedNodes(oldData, diff)
	if err != nil {
		st.torn = true
		return false, err
	}
	st.advance(removed, newKids, diff, *root, m.commit, m.rev)
	return true, nil
}

// errBehind means a cached tree could not be caught up from what was
// read (a node neither cached nor new: the repository was replaced, by an
// import or a deletion); the caller loads the tree whole.
var errBehind = fmt.Errorf("%w: cached tree cannot be caught up", ErrCorruptRepo)

// catchUp brings st up to m. st's tree must be at st.data (no plan
// applied, or one undone): its nodes that the new tree still holds are
// found by walking it from the root down through the nodes the new tree
// dropped, which are the ones a commit's path rewrote, so the walk costs
// about what the new nodes do; they are reused as they are, and only the
// new nodes are decoded. On an error st is unusable.
func (st *repoState) catchUp(m *movedRoot) error {
	// The new nodes, decoded once, and every node they link to: an old
	// node is in the new tree exactly when a new node links to it (or it
	// is the root).
	decoded := make(map[cid.Cid]*mst.NodeData, len(m.nodes))
	kept := map[cid.Cid]bool{m.data: true}
	for c, b := range m.nodes {
		nd, err := mst.NodeDataFromCBOR(bytes.NewReader(b))
		if err != nil {
			return fmt.Errorf("%w: decoding MST node %s: %v", ErrCorruptRepo, c, err)
		}
		decoded[c] = nd
		for _, k := range nodeChildren(nd) {
			kept[k] = true
		}
	}
	reuse := map[cid.Cid]*mst.Node{}
	var removed []cid.Cid
	var walk func(n *mst.Node) error
	walk = func(n *mst.Node) error {
		if n == nil || n.CID == nil || n.Dirty {
			return errBehind
		}
		if kept[*n.CID] {
			reuse[*n.CID] = n
			return nil
		}
		removed = append(removed, *n.CID)
		for _, e := range n.Entries {
			if e.ChildCID != nil {
				if err := walk(e.Child); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(st.tree.Root); err != nil {
		return err
	}
	root, err := buildNode(m.data, -1, reuse, decoded)
	if err != nil {
		return err
	}
	for _, c := range removed {
		st.size -= int64(len(st.nodes[c]))
		delete(st.nodes, c)
		delete(st.kids, c)
	}
	if st.kids == nil {
		st.kids = make(map[cid.Cid][]cid.Cid, len(decoded))
	}
	for c, nd := range decoded {
		if _, ok := st.nodes[c]; !ok {
			st.nodes[c] = m.nodes[c]
			st.size += int64(len(m.nodes[c]))
		}
		st.kids[c] = nodeChildren(nd)
	}
	st.tree = &mst.Tree{Root: root}
	st.data, st.commit, st.rev = m.data, m.commit, m.rev
	return nil
}

// buildNode returns the decoded subtree rooted at c: a node of reuse as it
// is, or a new node with its children built in turn. hint is the height
// the parent implies (-1: unknown), for nodes with no key of their own to
// tell it.
func buildNode(c cid.Cid, hint int, reuse map[cid.Cid]*mst.Node, decoded map[cid.Cid]*mst.NodeData) (*mst.Node, error) {
	if n, ok := reuse[c]; ok {
		return n, nil
	}
	nd, ok := decoded[c]
	if !ok {
		return nil, errBehind
	}
	n := nd.Node(&c)
	if n.Height < 0 {
		n.Height = hint
	}
	for i, e := range n.Entries {
		if e.ChildCID == nil {
			continue
		}
		childHint := -1
		if n.Height > 0 {
			childHint = n.Height - 1
		}
		child, err := buildNode(*e.ChildCID, childHint, reuse, decoded)
		if err != nil {
			return nil, err
		}
		n.Entries[i].Child = child
		if n.Height < 0 && child.Height >= 0 {
			n.Height = child.Height + 1
		}
	}
	return &n, nil
}
