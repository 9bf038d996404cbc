package repo

import (
	"context"
	"errors"

	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	ipld "github.com/ipfs/go-ipld-format"
)

// diffCollector receives the blocks mst.Tree.WriteDiffBlocks writes, in
// order and with their full CIDs (the stock map-backed blockstore hands
// back raw-codec CIDs, which break CAR slices). It implements the subset of
// go-ipfs-blockstore's Blockstore that WriteDiffBlocks calls; the rest
// refuse.
type diffCollector struct {
	blocks []blocks.Block
	seen   map[cid.Cid]struct{}
}

func newDiffCollector() *diffCollector {
	return &diffCollector{seen: map[cid.Cid]struct{}{}}
}

var errNotSupported = errors.New("not supported by the diff collector")

func (c *diffCollector) Put(_ context.Context, b blocks.Block) error {
	if _, ok := c.seen[b.Cid()]; ok {
		return nil
	}
	c.seen[b.Cid()] = struct{}{}
	c.blocks = append(c.blocks, b)
	return nil
}

func (c *diffCollector) PutMany(ctx context.Context, bs []blocks.Block) error {
	for _, b := range bs {
		if err := c.Put(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

func (c *diffCollector) Has(_ context.Context, k cid.Cid) (bool, error) {
	_, ok := c.seen[k]
	return ok, nil
}

func (c *diffCollector) Get(context.Context, cid.Cid) (blocks.Block, error) {
	return nil, errNotSupported
}

func (c *diffCollector) GetSize(context.Context, cid.Cid) (int, error) {
	return 0, errNotSupported
}

func (c *diffCollector) DeleteBlock(context.Context, cid.Cid) error { return errNotSupported }

func (c *diffCollector) AllKeysChan(context.Context) (<-chan cid.Cid, error) {
	return nil, errNotSupported
}

func (c *diffCollector) HashOnRead(bool) {}

// nodeSource serves MST node blocks from memory to mst.LoadTreeFromStore. A
// missing node is reported as ipld's not-found, which the MST loader takes as
// a partial tree; the engine then refuses the tree.
type nodeSource map[cid.Cid][]byte

func (s nodeSource) Get(_ context.Context, k cid.Cid) (blocks.Block, error) {
	data, ok := s[k]
	if !ok {
		return nil, ipld.ErrNotFound{Cid: k}
	}
	return blocks.NewBlockWithCid(data, k)
}
