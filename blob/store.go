package blob

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
)

// ErrObjectNotFound means the store holds no object under the key.
var ErrObjectNotFound = errors.New("blob object not found")

// Store is where blob bytes live, keyed by CID string. Implementations are
// safe for concurrent use. Writing the same key twice is harmless: keys are
// content addresses, so both writers hold the same bytes.
type Store interface {
	// Create starts a new object whose key is not known until its bytes
	// have been written (the caller hashes them on the way).
	Create(ctx context.Context) (Writer, error)
	// Open returns the object for reading, seekable so that range requests
	// cost only the bytes they ask for. ErrObjectNotFound if absent.
	Open(ctx context.Context, key string) (io.ReadSeekCloser, error)
	// Stat returns the object's size, or ErrObjectNotFound.
	Stat(ctx context.Context, key string) (int64, error)
	// Delete removes the object. Deleting a missing object is not an error.
	Delete(ctx context.Context, key string) error
}

// Writer receives a new object's bytes.
type Writer interface {
	io.Writer
	// Commit stores what was written under key, atomically: readers see
	// the whole object or nothing. It may be called again (after the
	// object was deleted by someone else) until Close.
	Commit(ctx context.Context, key string) error
	// Close releases the writer's scratch space. Bytes never committed are
	// discarded; committed objects stay.
	Close() error
}

// cidFromSHA256 builds the CID atproto uses for blobs: CIDv1, raw codec,
// sha2-256.
func cidFromSHA256(sum []byte) (cid.Cid, error) {
	mh, err := multihash.Encode(sum, multihash.SHA2_256)
	if err != nil {
		return cid.Undef, err
	}
	return cid.NewCidV1(cid.Raw, mh), nil
}

// ComputeCID returns the blob CID of data.
func ComputeCID(data []byte) cid.Cid {
	sum := sha256.Sum256(data)
	c, err := cidFromSHA256(sum[:])
	if err != nil {
		// Encoding a 32-byte sha2-256 digest cannot fail.
		panic(err)
	}
	return c
}
