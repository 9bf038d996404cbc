package repo

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/fastsyntax"
)

// Batches of the import's tree walk.
const (
	// walkBatch is how many MST nodes one lookup asks for.
	walkBatch = 500
	// walkBatchBytes bounds the node bytes one lookup returns.
	walkBatchBytes = 4 << 20
	// stageBatch is how many nodes or entries one insert stages.
	stageBatch = 2000
)

// walkItem is an MST node still to check: its CID, the height it must
// have (-1 for the root, whose keys decide it), and the keys its subtree
// must lie strictly between (nil: no bound).
type walkItem struct {
	cid    cid.Cid
	height int
	lo, hi []byte
}

// treeEntry is one record the tree names.
type treeEntry struct {
	path, collection, rkey string
	cid                    cid.Cid
}

// walkStage collects what the walk found until it is inserted.
type walkStage struct {
	nodes   [][]byte
	entries []treeEntry
}

// walk checks the MST rooted at root, node by node, and stages the CIDs
// of its nodes (import_nodes) and its records (import_entries). It goes
// depth first, a batch of nodes per lookup, so what it holds is a stack of
// about a batch per tree level, whatever the size of the tree. Each node
// must decode, be canonically encoded, hold keys in order and within its
// parent's bounds, at the height their hash gives, with children one level
// below: the checks of indigo's mst.Tree.Verify, made without loading the
// tree into memory. Every key must be a record path (collection/rkey).
func (imp *importer) walk(ctx context.Context, root cid.Cid) error {
	stack := []walkItem{{cid: root, height: -1}}
	st := &walkStage{}
	for len(stack) > 0 {
		n := min(len(stack), walkBatch)
		batch := make(map[string]walkItem, n)
		keys := make([][]byte, 0, n)
		for _, it := range stack[len(stack)-n:] {
			k := it.cid.Bytes()
			if _, dup := batch[string(k)]; dup {
				return fmt.Errorf("%w: MST node %s is referenced twice", ErrInvalidImport, it.cid)
			}
			batch[string(k)] = it
			keys = append(keys, k)
		}
		stack = stack[:len(stack)-n]
		rows, err := imp.tx.Query(ctx, qImportNodeBatch, keys, walkBatchBytes)
		if err != nil {
			return fmt.Errorf("reading staged MST nodes: %w", db.Translate(err))
		}
		var raw, data []byte
		_, err = pgx.ForEachRow(rows, []any{&raw, &data}, func() error {
			it, ok := batch[string(raw)]
			if !ok {
				return fmt.Errorf("%w: staged node lookup returned an unrequested block", ErrCorruptRepo)
			}
			delete(batch, string(raw))
			if data == nil {
				// Over the batch's byte bound: asked for again.
				stack = append(stack, it)
				return nil
			}
			kids, err := checkNode(it, data, st)
			if err != nil {
				return err
			}
			stack = append(stack, kids...)
			st.nodes = append(st.nodes, it.cid.Bytes())
			return nil
		})
		if err != nil {
			return translateWalk(err)
		}
		if len(batch) > 0 {
			return fmt.Errorf("%w: the CAR lacks MST node %s", ErrInvalidImport, anyItem(batch).cid)
		}
		if len(st.nodes) >= stageBatch || len(st.entries) >= stageBatch {
			if err := imp.flushWalk(ctx, st); err != nil {
				return err
			}
		}
	}
	return imp.flushWalk(ctx, st)
}

// anyItem returns one item of a non-empty batch.
func anyItem(batch map[string]walkItem) walkItem {
	for _, it := range batch {
		return it
	}
	return walkItem{}
}

// translateWalk passes a check's error on and translates a driver's.
func translateWalk(err error) error {
	if errors.Is(err, ErrInvalidImport) || errors.Is(err, ErrCorruptRepo) {
		return err
	}
	return fmt.Errorf("reading staged MST nodes: %w", db.Translate(err))
}

// flushWalk inserts the staged nodes and entries. A node or a path met
// twice is a unique violation: the tree is not a tree.
func (imp *importer) flushWalk(ctx context.Context, st *walkStage) error {
	if len(st.nodes) > 0 {
		if _, err := imp.tx.Exec(ctx, qImportAddNodes, st.nodes); err != nil {
			return stageErr("MST nodes", err)
		}
		st.nodes = st.nodes[:0]
	}
	if len(st.entries) == 0 {
		return nil
	}
	paths := make([]string, len(st.entries))
	cols := make([]string, len(st.entries))
	rkeys := make([]string, len(st.entries))
	cids := make([][]byte, len(st.entries))
	for i, e := range st.entries {
		paths[i], cols[i], rkeys[i], cids[i] = e.path, e.collection, e.rkey, e.cid.Bytes()
	}
	if _, err := imp.tx.Exec(ctx, qImportAddEntries, paths, cols, rkeys, cids); err != nil {
		return stageErr("records", err)
	}
	st.entries = st.entries[:0]
	return nil
}

func stageErr(what string, err error) error {
	err = db.Translate(err)
	if errors.Is(err, db.ErrConflict) {
		return fmt.Errorf("%w: the MST names the same node or record twice", ErrInvalidImport)
	}
	return fmt.Errorf("staging imported %s: %w", what, err)
}

// checkNode checks one MST node against its place in the tree, adds its
// records to st, and returns its children.
func checkNode(it walkItem, data []byte, st *walkStage) ([]walkItem, error) {
	nd, err := mst.NodeDataFromCBOR(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: MST node %s does not decode: %v", ErrInvalidImport, it.cid, err)
	}
	if enc, _, err := nd.Bytes(); err != nil || !bytes.Equal(enc, data) {
		return nil, fmt.Errorf("%w: MST node %s is not canonically encoded", ErrInvalidImport, it.cid)
	}
	if len(nd.Entries) == 0 {
		return checkKeylessNode(it, nd)
	}
	height := it.height
	keys := make([][]byte, len(nd.Entries))
	var prev []byte
	for i, e := range nd.Entries {
		if e.PrefixLen < 0 || int(e.PrefixLen) > len(prev) {
			return nil, fmt.Errorf("%w: MST node %s: entry %d has a bad key prefix length", ErrInvalidImport, it.cid, i)
		}
		key := make([]byte, 0, int(e.PrefixLen)+len(e.KeySuffix))
		key = append(append(key, prev[:e.PrefixLen]...), e.KeySuffix...)
		if i > 0 && int(e.PrefixLen) != mst.CountPrefixLen(prev, key) {
			return nil, fmt.Errorf("%w: MST node %s: key %q is not prefix-compressed canonically", ErrInvalidImport, it.cid, key)
		}
		if (i > 0 && bytes.Compare(key, prev) <= 0) || (it.lo != nil && bytes.Compare(key, it.lo) <= 0) || (it.hi != nil && bytes.Compare(key, it.hi) >= 0) {
			return nil, fmt.Errorf("%w: MST node %s: key %q is out of order", ErrInvalidImport, it.cid, key)
		}
		h := mst.HeightForKey(key)
		if height < 0 {
			height = h
		} else if h != height {
			return nil, fmt.Errorf("%w: MST node %s: key %q belongs at height %d, not %d", ErrInvalidImport, it.cid, key, h, height)
		}
		entry, err := recordEntry(key, e.Value)
		if err != nil {
			return nil, err
		}
		st.entries = append(st.entries, entry)
		keys[i] = key
		prev = key
	}
	var kids []walkItem
	child := func(c *cid.Cid, lo, hi []byte) error {
		if c == nil {
			return nil
		}
		if height == 0 {
			return fmt.Errorf("%w: MST node %s is at height 0 but points to a subtree", ErrInvalidImport, it.cid)
		}
		kids = append(kids, walkItem{cid: *c, height: height - 1, lo: lo, hi: hi})
		return nil
	}
	if err := child(nd.Left, it.lo, keys[0]); err != nil {
		return nil, err
	}
	for i, e := range nd.Entries {
		hi := it.hi
		if i+1 < len(keys) {
			hi = keys[i+1]
		}
		if err := child(e.Right, keys[i], hi); err != nil {
			return nil, err
		}
	}
	return kids, nil
}

// checkKeylessNode checks a node without keys: the root of an empty
// repository, or a node that only bridges a gap in heights on the way to
// a subtree.
func checkKeylessNode(it walkItem, nd *mst.NodeData) ([]walkItem, error) {
	switch {
	case nd.Left == nil && it.height < 0:
		return nil, nil // the empty repository
	case nd.Left == nil:
		return nil, fmt.Errorf("%w: MST node %s is empty", ErrInvalidImport, it.cid)
	case it.height < 0:
		return nil, fmt.Errorf("%w: the MST root %s holds no keys, only a pointer to a subtree", ErrInvalidImport, it.cid)
	case it.height == 0:
		return nil, fmt.Errorf("%w: MST node %s is at height 0 but points to a subtree", ErrInvalidImport, it.cid)
	}
	return []walkItem{{cid: *nd.Left, height: it.height - 1, lo: it.lo, hi: it.hi}}, nil
}

// recordEntry checks that an MST key is a record path.
func recordEntry(key []byte, value cid.Cid) (treeEntry, error) {
	path := string(key)
	if !mst.IsValidKey(key) {
		return treeEntry{}, fmt.Errorf("%w: MST key %q is not a valid repository path", ErrInvalidImport, path)
	}
	col, rkey, ok := bytes.Cut(key, []byte{'/'})
	if !ok {
		return treeEntry{}, fmt.Errorf("%w: MST key %q is not a record path (collection/rkey)", ErrInvalidImport, path)
	}
	if _, err := fastsyntax.ParseNSID(string(col)); err != nil {
		return treeEntry{}, fmt.Errorf("%w: MST key %q: the collection is not an NSID: %v", ErrInvalidImport, path, err)
	}
	if _, err := fastsyntax.ParseRecordKey(string(rkey)); err != nil {
		return treeEntry{}, fmt.Errorf("%w: MST key %q: invalid record key: %v", ErrInvalidImport, path, err)
	}
	return treeEntry{path: path, collection: string(col), rkey: string(rkey), cid: value}, nil
}
