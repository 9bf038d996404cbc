package repo

import (
	"container/list"
	"sync"

	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/ipfs/go-cid"
)

// repoState is a repository's MST, decoded, with the bytes of every node (so
// that the nodes a commit drops can be found without the old tree, which
// the MST mutates in place).
type repoState struct {
	did string
	// commit and rev are the commit the tree belongs to.
	commit cid.Cid
	rev    string
	data   cid.Cid
	tree   *mst.Tree
	nodes  nodeSource
	// kids caches the child node CIDs of nodes (a subset of them), so
	// finding the nodes a commit drops need not decode them again.
	kids map[cid.Cid][]cid.Cid
	size int64
	// checks is how many more commits ask whether another process moved
	// the repository before they are worked out (refresh.go).
	checks int
	// shared is how many more of this process's commits to the
	// repository are hinted to the other nodes (hints.go): set when
	// another node is found writing to it, so hints cost nothing where
	// each repository is written by one node.
	shared int
	// torn is set when a plan could not be undone: the tree is not at
	// data, and the state must not be used again.
	torn bool
}

// treeCache keeps recently written repositories' trees, bounded by node
// bytes, least recently used out first. A writer takes a state out (so no
// one else can see it mid-mutation) and puts the new one back only after its
// commit is stored; a failed commit simply leaves the repo uncached.
type treeCache struct {
	mu    sync.Mutex
	max   int64
	used  int64
	order *list.List // of *repoState, front = most recent
	byDID map[string]*list.Element
}

func newTreeCache(max int64) *treeCache {
	return &treeCache{max: max, order: list.New(), byDID: map[string]*list.Element{}}
}

// take removes and returns did's cached state if it is at root data.
func (c *treeCache) take(did string, data cid.Cid) *repoState {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byDID[did]
	if !ok {
		return nil
	}
	c.remove(el)
	st := el.Value.(*repoState)
	if !st.data.Equals(data) {
		// Another process wrote this repo since; the state is stale.
		return nil
	}
	return st
}

func (c *treeCache) put(st *repoState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byDID[st.did]; ok {
		c.remove(el)
	}
	if st.size > c.max || st.torn {
		return
	}
	c.byDID[st.did] = c.order.PushFront(st)
	c.used += st.size
	for c.used > c.max {
		c.remove(c.order.Back())
	}
}

func (c *treeCache) remove(el *list.Element) {
	st := el.Value.(*repoState)
	c.order.Remove(el)
	delete(c.byDID, st.did)
	c.used -= st.size
}

// has reports whether did's state is cached.
func (c *treeCache) has(did string) bool {
	_, ok := c.revOf(did)
	return ok
}

// revOf is the rev of did's cached state, if there is one.
func (c *treeCache) revOf(did string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byDID[did]
	if !ok {
		return "", false
	}
	return el.Value.(*repoState).rev, true
}

// drop forgets did's state, if cached.
func (c *treeCache) drop(did string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byDID[did]; ok {
		c.remove(el)
	}
}

// takeAny removes and returns did's cached state whatever its root; the
// caller checks the root against the database before trusting it.
func (c *treeCache) takeAny(did string) *repoState {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byDID[did]
	if !ok {
		return nil
	}
	c.remove(el)
	return el.Value.(*repoState)
}
