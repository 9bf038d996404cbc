package repotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"
)

// Block is one block of a CAR.
type Block struct {
	CID  cid.Cid
	Data []byte
}

// CBORBlock returns data as a DAG-CBOR SHA-256 block.
func CBORBlock(data []byte) Block {
	c, err := cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256).Sum(data)
	if err != nil {
		panic(err)
	}
	return Block{CID: c, Data: data}
}

// WriteCAR writes a CAR v1 with exactly the roots and blocks given, in
// order, so that tests can build malformed ones too.
func WriteCAR(w io.Writer, roots []cid.Cid, blks ...Block) error {
	if err := car.WriteHeader(&car.CarHeader{Roots: roots, Version: 1}, w); err != nil {
		return err
	}
	for _, b := range blks {
		if err := carutil.LdWrite(w, b.CID.Bytes(), b.Data); err != nil {
			return err
		}
	}
	return nil
}

// SplitCAR returns a CAR's roots and blocks, in order.
func SplitCAR(t testing.TB, data []byte) ([]cid.Cid, []Block) {
	t.Helper()
	cr, err := car.NewCarReader(bytes.NewReader(data))
	require.NoError(t, err)
	var out []Block
	for {
		b, err := cr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		out = append(out, Block{CID: b.Cid(), Data: b.RawData()})
	}
	return cr.Header.Roots, out
}

// Recommit returns a repository CAR (one root, its commit) with the same
// tree and records under a new commit for did, signed with key at rev: the
// same repository as another account's export would hold it on another
// server.
func Recommit(t testing.TB, data []byte, did syntax.DID, key atcrypto.PrivateKey, rev string) []byte {
	t.Helper()
	roots, blks := SplitCAR(t, data)
	require.Len(t, roots, 1)
	out := make([]Block, 0, len(blks))
	var commit Block
	for _, b := range blks {
		if !b.CID.Equals(roots[0]) {
			out = append(out, b)
			continue
		}
		var c atrepo.Commit
		require.NoError(t, c.UnmarshalCBOR(bytes.NewReader(b.Data)))
		var err error
		commit, err = Commit(did, c.Data, rev, key)
		require.NoError(t, err)
	}
	require.True(t, commit.CID.Defined(), "the CAR holds its commit")
	var buf bytes.Buffer
	require.NoError(t, WriteCAR(&buf, []cid.Cid{commit.CID}, append([]Block{commit}, out...)...))
	return buf.Bytes()
}

// Commit returns did's commit of the tree rooted at data, signed with key,
// as a block.
func Commit(did syntax.DID, data cid.Cid, rev string, key atcrypto.PrivateKey) (Block, error) {
	c := atrepo.Commit{DID: did.String(), Version: atrepo.ATPROTO_REPO_VERSION, Data: data, Rev: rev}
	if err := c.Sign(key); err != nil {
		return Block{}, err
	}
	var buf bytes.Buffer
	if err := c.MarshalCBOR(&buf); err != nil {
		return Block{}, err
	}
	return CBORBlock(buf.Bytes()), nil
}

// RecordFunc returns the i-th record of a repository being written: its
// path (collection/rkey) and DAG-CBOR block. WriteRepoCAR calls it twice
// for each i and needs the same answer both times.
type RecordFunc func(i int) (path string, block []byte)

// WriteRepoCAR writes a whole signed repository of n records to w, as
// another server's getRepo would: the commit (did's, signed with key, at
// rev), the MST nodes, then the records. Only the tree is held in memory;
// the records are asked for again as they are written, so a test can
// stream a large repository to a file.
func WriteRepoCAR(ctx context.Context, w io.Writer, did syntax.DID, key atcrypto.PrivateKey, rev string, n int, rec RecordFunc) (cid.Cid, error) {
	tree := mst.NewEmptyTree()
	for i := range n {
		path, block := rec(i)
		c := CBORBlock(block).CID
		if _, err := tree.Insert([]byte(path), c); err != nil {
			return cid.Undef, fmt.Errorf("inserting %s: %w", path, err)
		}
	}
	nodes := &collector{}
	root, err := tree.WriteDiffBlocks(ctx, nodes)
	if err != nil {
		return cid.Undef, err
	}
	tree = mst.Tree{}
	commit, err := Commit(did, *root, rev, key)
	if err != nil {
		return cid.Undef, err
	}
	if err := WriteCAR(w, []cid.Cid{commit.CID}, commit); err != nil {
		return cid.Undef, err
	}
	for _, b := range nodes.blocks {
		if err := carutil.LdWrite(w, b.Cid().Bytes(), b.RawData()); err != nil {
			return cid.Undef, err
		}
	}
	nodes = nil
	for i := range n {
		_, block := rec(i)
		if err := carutil.LdWrite(w, CBORBlock(block).CID.Bytes(), block); err != nil {
			return cid.Undef, err
		}
	}
	return commit.CID, nil
}

// RepoCAR returns a whole signed repository holding records (path to
// record data) as a CAR.
func RepoCAR(t testing.TB, did syntax.DID, key atcrypto.PrivateKey, rev string, records map[string]map[string]any) []byte {
	t.Helper()
	encoded := make(map[string][]byte, len(records))
	for p, rec := range records {
		b, err := atdata.MarshalCBOR(rec)
		require.NoError(t, err)
		encoded[p] = b
	}
	return RepoCARBlocks(t, did, key, rev, encoded)
}

// RepoCARBlocks is RepoCAR with the records given as DAG-CBOR blocks, which
// need not be valid records.
func RepoCARBlocks(t testing.TB, did syntax.DID, key atcrypto.PrivateKey, rev string, records map[string][]byte) []byte {
	t.Helper()
	paths := make([]string, 0, len(records))
	for p := range records {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	_, err := WriteRepoCAR(context.Background(), &buf, did, key, rev, len(paths), func(i int) (string, []byte) {
		return paths[i], records[paths[i]]
	})
	require.NoError(t, err)
	return buf.Bytes()
}

// collector keeps the blocks mst.Tree.WriteDiffBlocks writes, with their
// full CIDs.
type collector struct {
	blocks []blocks.Block
}

func (c *collector) Put(_ context.Context, b blocks.Block) error {
	c.blocks = append(c.blocks, b)
	return nil
}

func (c *collector) PutMany(ctx context.Context, bs []blocks.Block) error {
	c.blocks = append(c.blocks, bs...)
	return nil
}

func (c *collector) Has(context.Context, cid.Cid) (bool, error) { return false, nil }

func (c *collector) Get(context.Context, cid.Cid) (blocks.Block, error) {
	return nil, fmt.Errorf("not supported")
}

func (c *collector) GetSize(context.Context, cid.Cid) (int, error) {
	return 0, fmt.Errorf("not supported")
}

func (c *collector) DeleteBlock(context.Context, cid.Cid) error { return fmt.Errorf("not supported") }

func (c *collector) AllKeysChan(context.Context) (<-chan cid.Cid, error) {
	return nil, fmt.Errorf("not supported")
}

func (c *collector) HashOnRead(bool) {}
