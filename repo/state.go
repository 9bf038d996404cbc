package repo

import (
	"bytes"
	"context"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

// loadState returns did's tree at data: from the cache when it holds that
// exact root, otherwise from Postgres in one query.
func (e *Engine) loadState(ctx context.Context, q db.DBTX, did string, data cid.Cid) (*repoState, error) {
	if st := e.cache.take(did, data); st != nil {
		return st, nil
	}
	rows, err := q.Query(ctx, qLoadNodes, did)
	if err != nil {
		return nil, fmt.Errorf("loading MST nodes: %w", db.Translate(err))
	}
	nodes := nodeSource{}
	var size int64
	var raw, blk []byte
	_, err = pgx.ForEachRow(rows, []any{&raw, &blk}, func() error {
		c, err := cid.Cast(raw)
		if err != nil {
			return fmt.Errorf("%w: node cid: %v", ErrCorruptRepo, err)
		}
		nodes[c] = append([]byte(nil), blk...)
		size += int64(len(blk))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading MST nodes: %w", db.Translate(err))
	}
	tree, err := mst.LoadTreeFromStore(ctx, nodes, data)
	if err != nil {
		return nil, fmt.Errorf("%w: loading MST %s: %v", ErrCorruptRepo, data, err)
	}
	// A node missing from the store makes the MST take the tree as
	// partial, and writes to a partial tree silently skip proof nodes.
	if tree.IsPartial() {
		return nil, fmt.Errorf("%w: MST %s of %s is missing nodes", ErrCorruptRepo, data, did)
	}
	return &repoState{did: did, data: data, tree: tree, nodes: nodes, size: size}, nil
}

// lockedState returns did's tree at root (read under the repo's row lock,
// through q): cached, when there is one, as it is when the root has not
// moved, or caught up with since (bulwark_repo_since's answer, read under
// the lock) when it has; else the tree loaded whole.
func (e *Engine) lockedState(ctx context.Context, q db.DBTX, did string, cached *repoState, root *movedRoot, since [][]byte) (*repoState, error) {
	if cached != nil && !cached.torn {
		if since == nil && cached.at(root) {
			return cached, nil
		}
		if since != nil && e.refresh(ctx, q, cached, since) && cached.at(root) {
			return cached, nil
		}
	}
	st, err := e.loadState(ctx, q, did, root.data)
	if err != nil {
		return nil, err
	}
	st.commit, st.rev = root.commit, root.rev
	if cached != nil {
		st.checks, st.shared = checksAfterMove, hintsAfterMove
	}
	return st, nil
}

// at reports whether st is the tree of root: the same commit, MST root
// and rev (a commit CID binds the other two; checking them too keeps a
// state whose commit was set apart from its tree from being used).
func (st *repoState) at(root *movedRoot) bool {
	return st.commit.Equals(root.commit) && st.data.Equals(root.data) && st.rev == root.rev
}

// removedNodes returns the nodes of st's tree before this commit (rooted
// at oldRoot) that the new tree no longer contains, and the children of the
// commit's new nodes. The new tree's nodes are the written diff plus
// unchanged subtrees those reference, so an old node is kept exactly when
// it was rewritten or a rewritten node points at it; the walk descends only
// through dropped nodes, so it costs about as much as the diff itself. Old
// nodes' children come from st.kids (filled as nodes are written, or on
// first use), so a commit decodes only the nodes it writes.
func (st *repoState) removedNodes(oldRoot cid.Cid, diff *diffCollector) ([]cid.Cid, map[cid.Cid][]cid.Cid, error) {
	kept := make(map[cid.Cid]bool, len(diff.blocks)*3)
	newKids := make(map[cid.Cid][]cid.Cid, len(diff.blocks))
	// The new nodes' children, read off the tree in memory (the nodes just
	// written are the root and the changed nodes under it, each reached
	// through its parent) rather than by decoding the blocks again.
	var walk func(n *mst.Node)
	walk = func(n *mst.Node) {
		if n == nil || n.CID == nil || newKids[*n.CID] != nil {
			return
		}
		if _, ok := diff.seen[*n.CID]; !ok {
			return
		}
		kids := make([]cid.Cid, 0, len(n.Entries))
		for _, e := range n.Entries {
			if e.ChildCID != nil {
				kids = append(kids, *e.ChildCID)
				walk(e.Child)
			}
		}
		newKids[*n.CID] = kids
	}
	walk(st.tree.Root)
	for _, b := range diff.blocks {
		kept[b.Cid()] = true
		kids, ok := newKids[b.Cid()]
		if !ok {
			// Not reached from the root in memory (cannot happen for a
			// complete tree): decode it.
			nd, err := mst.NodeDataFromCBOR(bytes.NewReader(b.RawData()))
			if err != nil {
				return nil, nil, fmt.Errorf("decoding new MST node: %w", err)
			}
			kids = nodeChildren(nd)
			newKids[b.Cid()] = kids
		}
		for _, c := range kids {
			kept[c] = true
		}
	}
	var removed []cid.Cid
	stack := []cid.Cid{oldRoot}
	for len(stack) > 0 {
		c := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if kept[c] {
			continue
		}
		removed = append(removed, c)
		kids, err := st.children(c)
		if err != nil {
			return nil, nil, err
		}
		stack = append(stack, kids...)
	}
	return removed, newKids, nil
}

// children returns the child nodes of node c of st's tree.
func (st *repoState) children(c cid.Cid) ([]cid.Cid, error) {
	if kids, ok := st.kids[c]; ok {
		return kids, nil
	}
	data, ok := st.nodes[c]
	if !ok {
		return nil, fmt.Errorf("%w: old MST node %s missing", ErrCorruptRepo, c)
	}
	nd, err := mst.NodeDataFromCBOR(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: decoding old MST node %s: %v", ErrCorruptRepo, c, err)
	}
	kids := nodeChildren(nd)
	if st.kids == nil {
		st.kids = make(map[cid.Cid][]cid.Cid)
	}
	st.kids[c] = kids
	return kids, nil
}

func nodeChildren(nd *mst.NodeData) []cid.Cid {
	var out []cid.Cid
	if nd.Left != nil {
		out = append(out, *nd.Left)
	}
	for _, e := range nd.Entries {
		if e.Right != nil {
			out = append(out, *e.Right)
		}
	}
	return out
}

// advance brings st up to a stored commit: the nodes it dropped go, the
// nodes it wrote (and their children) come in, and the root, commit and
// rev become the new ones.
func (st *repoState) advance(removed []cid.Cid, newKids map[cid.Cid][]cid.Cid, diff *diffCollector, root, commit cid.Cid, rev string) {
	for _, c := range removed {
		st.size -= int64(len(st.nodes[c]))
		delete(st.nodes, c)
		delete(st.kids, c)
	}
	if st.kids == nil {
		st.kids = make(map[cid.Cid][]cid.Cid, len(newKids))
	}
	for c, kids := range newKids {
		st.kids[c] = kids
	}
	for _, b := range diff.blocks {
		if _, ok := st.nodes[b.Cid()]; !ok {
			st.nodes[b.Cid()] = b.RawData()
			st.size += int64(len(b.RawData()))
		}
	}
	st.data, st.commit, st.rev = root, commit, rev
}
