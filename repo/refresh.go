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

// Catching up a cached tree. Several processes writing one repository (a
// cluster behind a round-robin balancer) each cache its tree, and a commit
// built on a tree another process has moved on from is refused. Reloading
// the whole tree then costs a round trip per repository size; instead the
// refusal itself (bulwark_try_commit) brings the stored root and the MST
// nodes written since the cached rev, and the tree is rebuilt from them
// and from the cached tree's nodes: the unchanged subtrees are reused as
// decoded, and only the new nodes are decoded.

// maxRefreshes is how many times a commit is rebuilt on a caught-up tree
// before it takes the locked path (the repository is being written
// through several processes at once).
const maxRefreshes = 3

// movedRoot is the stored root a cached tree has fallen behind, and the
// MST nodes written since the cached rev.
type movedRoot struct {
	commit, data cid.Cid
	rev          string
	nodes        nodeSource
}

// parseMoved decodes bulwark_try_commit's answer: the commit CID, the MST
// root CID and the rev, then the new nodes' CIDs, then their blocks.
func parseMoved(raw [][]byte) (*movedRoot, error) {
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
	m.nodes = make(nodeSource, n)
	for i := range n {
		c, err := cid.Cast(raw[3+i])
		if err != nil {
			return nil, fmt.Errorf("%w: node cid: %v", ErrCorruptRepo, err)
		}
		m.nodes[c] = raw[3+n+i]
	}
	return m, nil
}

// nodesSince reads, through q, did's MST nodes written after rev.
func nodesSince(ctx context.Context, q db.DBTX, did, rev string) (nodeSource, error) {
	rows, err := q.Query(ctx, qNodesSince, did, rev)
	if err != nil {
		return nil, fmt.Errorf("reading new MST nodes: %w", db.Translate(err))
	}
	nodes := nodeSource{}
	var raw, blk []byte
	_, err = pgx.ForEachRow(rows, []any{&raw, &blk}, func() error {
		c, err := cid.Cast(raw)
		if err != nil {
			return fmt.Errorf("%w: node cid: %v", ErrCorruptRepo, err)
		}
		nodes[c] = append([]byte(nil), blk...)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading new MST nodes: %w", db.Translate(err))
	}
	return nodes, nil
}

// errBehind means a cached tree could not be caught up from what was
// read (a node neither cached nor new: the repository was replaced, by an
// import or a deletion); the caller loads the tree whole.
var errBehind = fmt.Errorf("%w: cached tree cannot be caught up", ErrCorruptRepo)

// refreshed returns the state of m's root built from st (whose tree may
// have been changed by a plan that was refused: only its clean nodes,
// whose CIDs are those of their content, are reused) and m's new nodes.
// st is not usable afterwards: the new tree shares its nodes.
func (st *repoState) refreshed(m *movedRoot) (*repoState, error) {
	reuse := map[cid.Cid]*mst.Node{}
	var index func(n *mst.Node)
	index = func(n *mst.Node) {
		if n == nil || n.Stub {
			return
		}
		if !n.Dirty && n.CID != nil {
			// A clean node's whole subtree is as its CID says (writing
			// blocks relies on the same).
			reuse[*n.CID] = n
			return
		}
		for _, e := range n.Entries {
			index(e.Child)
		}
	}
	index(st.tree.Root)
	block := func(c cid.Cid) ([]byte, bool) {
		if b, ok := m.nodes[c]; ok {
			return b, true
		}
		b, ok := st.nodes[c]
		return b, ok
	}
	root, err := buildNode(m.data, -1, reuse, block)
	if err != nil {
		return nil, err
	}
	out := &repoState{did: st.did, commit: m.commit, rev: m.rev, data: m.data, tree: &mst.Tree{Root: root},
		nodes: nodeSource{}, kids: map[cid.Cid][]cid.Cid{}}
	var collect func(n *mst.Node) error
	collect = func(n *mst.Node) error {
		b, ok := block(*n.CID)
		if !ok {
			return errBehind
		}
		out.nodes[*n.CID] = b
		out.size += int64(len(b))
		if kids, ok := st.kids[*n.CID]; ok {
			out.kids[*n.CID] = kids
		}
		for _, e := range n.Entries {
			if e.Child != nil {
				if err := collect(e.Child); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := collect(root); err != nil {
		return nil, err
	}
	return out, nil
}

// buildNode returns the decoded subtree rooted at c: a node of reuse as it
// is, or c's block decoded with its children built in turn. hint is the
// height the parent implies (-1: unknown), for nodes with no key of their
// own to tell it.
func buildNode(c cid.Cid, hint int, reuse map[cid.Cid]*mst.Node, block func(cid.Cid) ([]byte, bool)) (*mst.Node, error) {
	if n, ok := reuse[c]; ok {
		return n, nil
	}
	b, ok := block(c)
	if !ok {
		return nil, errBehind
	}
	nd, err := mst.NodeDataFromCBOR(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%w: decoding MST node %s: %v", ErrCorruptRepo, c, err)
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
		child, err := buildNode(*e.ChildCID, childHint, reuse, block)
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
