package lexresolve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
)

// Proof bounds.
const (
	// MaxProofBytes bounds a getRecord answer: a commit, the MST nodes on
	// one path, and a record of at most MaxRecordBytes.
	MaxProofBytes = 512 << 10
	// MaxRecordBytes bounds the lexicon record itself.
	MaxRecordBytes = 256 << 10
	// maxProofBlocks bounds the blocks read from a proof: a tree of any
	// real size is a few dozen levels deep at most.
	maxProofBlocks = 256
)

// dagCBOR is the codec of commits, MST nodes and records, and sha256 the
// multihash the repository spec allows.
const (
	dagCBOR = 0x71
	sha256  = 0x12
)

// VerifyRecordProof checks a com.atproto.sync.getRecord CAR for the
// record at collection/rkey in did's repository, signed with key, and
// returns the record's DAG-CBOR bytes and CID. It fails when a block's
// bytes do not hash to its CID, the root is not a commit of did signed
// with key, or the record is not in the tree the commit signed (a proof
// that leaves out a node on the path fails too).
func VerifyRecordProof(ctx context.Context, proof []byte, did syntax.DID, key atcrypto.PublicKey, collection syntax.NSID, rkey string) ([]byte, cid.Cid, error) {
	root, store, err := readProof(ctx, proof)
	if err != nil {
		return nil, cid.Undef, err
	}
	commitBlock, err := store.Get(ctx, root)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("the proof lacks its root block: %w", err)
	}
	var commit repo.Commit
	if err := commit.UnmarshalCBOR(bytes.NewReader(commitBlock.RawData())); err != nil {
		return nil, cid.Undef, fmt.Errorf("the root is not a commit: %w", err)
	}
	if err := commit.VerifyStructure(); err != nil {
		return nil, cid.Undef, fmt.Errorf("the root is not a valid commit: %w", err)
	}
	if commit.DID != did.String() {
		return nil, cid.Undef, fmt.Errorf("the commit is %s's, not %s's", commit.DID, did)
	}
	if err := commit.VerifySignature(key); err != nil {
		return nil, cid.Undef, fmt.Errorf("the commit's signature does not verify with %s's key: %w", did, err)
	}
	tree, err := mst.LoadTreeFromStore(ctx, store, commit.Data)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("reading the tree: %w", err)
	}
	path := collection.String() + "/" + rkey
	recordCID, err := tree.Get([]byte(path))
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("looking up %s in the proof: %w", path, err)
	}
	if recordCID == nil {
		return nil, cid.Undef, fmt.Errorf("%w: %s is not in the signed tree", ErrNotFound, path)
	}
	if recordCID.Prefix().Codec != dagCBOR {
		return nil, cid.Undef, fmt.Errorf("the record's CID %s is not DAG-CBOR", recordCID)
	}
	rec, err := store.Get(ctx, *recordCID)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("the proof lacks the record block: %w", err)
	}
	if len(rec.RawData()) > MaxRecordBytes {
		return nil, cid.Undef, fmt.Errorf("the record is larger than %d bytes", MaxRecordBytes)
	}
	return rec.RawData(), *recordCID, nil
}

// readProof reads a CAR of at most maxProofBlocks blocks into a store,
// checking that each block's bytes hash to its CID (the CAR reader does
// not), and returns its single root.
func readProof(ctx context.Context, proof []byte) (cid.Cid, *repo.TinyBlockstore, error) {
	cr, err := car.NewCarReader(bytes.NewReader(proof))
	if err != nil {
		return cid.Undef, nil, fmt.Errorf("not a CAR: %w", err)
	}
	if cr.Header.Version != 1 || len(cr.Header.Roots) != 1 {
		return cid.Undef, nil, errors.New("the proof is not a CAR v1 with one root")
	}
	store := repo.NewTinyBlockstore()
	for n := 0; ; n++ {
		blk, err := cr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return cid.Undef, nil, fmt.Errorf("reading the proof: %w", err)
		}
		if n >= maxProofBlocks {
			return cid.Undef, nil, fmt.Errorf("the proof has more than %d blocks", maxProofBlocks)
		}
		if blk.Cid().Prefix().MhType != sha256 {
			return cid.Undef, nil, fmt.Errorf("block %s is not hashed with SHA-256", blk.Cid())
		}
		sum, err := blk.Cid().Prefix().Sum(blk.RawData())
		if err != nil || !sum.Equals(blk.Cid()) {
			return cid.Undef, nil, fmt.Errorf("block %s does not hash to its CID", blk.Cid())
		}
		if err := store.Put(ctx, blk); err != nil {
			return cid.Undef, nil, err
		}
	}
	return cr.Header.Roots[0], store, nil
}
