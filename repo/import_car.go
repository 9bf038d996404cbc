package repo

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/ipfs/go-cid"
	cbor "github.com/ipfs/go-ipld-cbor"
	"github.com/ipld/go-car"
	"github.com/multiformats/go-multihash"
)

// Bounds of one CAR section, so that a hostile length prefix cannot make
// the reader allocate more than a few MiB.
const (
	// maxCARHeaderBytes bounds the CAR header (a repository export's is
	// about 60 bytes; this leaves room to count a list of roots).
	maxCARHeaderBytes = 64 << 10
	// MaxImportBlockBytes is the largest block an import accepts: four
	// times the data model's record limit, so that a record over the
	// limits can still be named in the refusal (or imported, when the
	// operator allows it) rather than cut off as a malformed CAR.
	MaxImportBlockBytes = 4 << 20
	// maxCIDBytes bounds the CID in front of a block.
	maxCIDBytes = 100
)

// countingReader counts the bytes read and refuses to read past max.
type countingReader struct {
	r   io.Reader
	n   int64
	max int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		return n, &ImportTooLargeError{Max: c.max}
	}
	return n, err
}

// carReader reads a CAR v1 stream one block at a time, checking each
// block's CID against its bytes. It keeps one block in memory.
type carReader struct {
	n      *countingReader
	r      *bufio.Reader
	buf    []byte
	blocks int64
}

func newCARReader(r io.Reader, max int64) *carReader {
	n := &countingReader{r: r, max: max}
	return &carReader{n: n, r: bufio.NewReaderSize(n, 64<<10)}
}

// readErr turns an error reading the stream into the error Import returns:
// the size limit as it is, the end of the stream as a truncated CAR, a
// failure of the reader (the client) as ErrImportRead.
func (cr *carReader) readErr(what string, err error) error {
	var tooLarge *ImportTooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return tooLarge
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: the CAR is truncated (%s, after %d bytes)", ErrInvalidImport, what, cr.n.n)
	default:
		return fmt.Errorf("%w while reading %s after %d bytes: %w", ErrImportRead, what, cr.n.n, err)
	}
}

// section reads one length-prefixed section of at most limit bytes into
// cr.buf. At a clean end of the stream it returns io.EOF.
func (cr *carReader) section(what string, limit int) ([]byte, error) {
	l, err := binary.ReadUvarint(cr.r)
	if errors.Is(err, io.EOF) {
		return nil, io.EOF
	}
	if err != nil {
		if isVarintOverflow(err) {
			return nil, fmt.Errorf("%w: %s has a malformed length prefix", ErrInvalidImport, what)
		}
		return nil, cr.readErr(what, err)
	}
	if l == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrInvalidImport, what)
	}
	if l > uint64(limit) {
		return nil, fmt.Errorf("%w: %s is %s bytes; the largest accepted is %s", ErrInvalidImport, what, commas(int(min(l, 1<<62))), commas(limit))
	}
	if cap(cr.buf) < int(l) {
		cr.buf = make([]byte, l, max(int(l), 64<<10))
	}
	cr.buf = cr.buf[:l]
	if _, err := io.ReadFull(cr.r, cr.buf); err != nil {
		return nil, cr.readErr(what, err)
	}
	return cr.buf, nil
}

// isVarintOverflow reports encoding/binary's error for a varint longer
// than ten bytes (it exports no sentinel for it).
func isVarintOverflow(err error) bool {
	return err.Error() == "binary: varint overflows a 64-bit integer"
}

// readHeader reads the CAR header and returns its one root.
func (cr *carReader) readHeader() (cid.Cid, error) {
	raw, err := cr.section("the CAR header", maxCARHeaderBytes)
	if errors.Is(err, io.EOF) {
		return cid.Undef, fmt.Errorf("%w: the body is empty; send the repository as a CAR (application/vnd.ipld.car)", ErrInvalidImport)
	}
	if err != nil {
		return cid.Undef, err
	}
	var h car.CarHeader
	if err := cbor.DecodeInto(raw, &h); err != nil {
		return cid.Undef, fmt.Errorf("%w: the body is not a CAR: its header does not decode: %v", ErrInvalidImport, err)
	}
	if h.Version != 1 {
		return cid.Undef, fmt.Errorf("%w: CAR version %d; only version 1 is accepted", ErrInvalidImport, h.Version)
	}
	if len(h.Roots) != 1 {
		return cid.Undef, fmt.Errorf("%w: the CAR has %d roots; a repository CAR has exactly one (its commit)", ErrInvalidImport, len(h.Roots))
	}
	return h.Roots[0], nil
}

// next returns the next block's CID bytes and data (valid until the next
// call), after checking that the CID is a DAG-CBOR SHA-256 CID of exactly
// these bytes. At the end of the CAR it returns io.EOF.
func (cr *carReader) next() (cid.Cid, []byte, []byte, error) {
	what := fmt.Sprintf("block %d", cr.blocks+1)
	sec, err := cr.section(what, MaxImportBlockBytes+maxCIDBytes)
	if err != nil {
		return cid.Undef, nil, nil, err
	}
	n, c, err := cid.CidFromBytes(sec[:min(len(sec), maxCIDBytes)])
	if err != nil {
		return cid.Undef, nil, nil, fmt.Errorf("%w: %s does not start with a CID: %v", ErrInvalidImport, what, err)
	}
	pre := c.Prefix()
	if pre.Version != 1 || pre.Codec != cid.DagCBOR || pre.MhType != multihash.SHA2_256 || pre.MhLength != sha256.Size {
		return cid.Undef, nil, nil, fmt.Errorf("%w: block %s has a CIDv%d with codec 0x%x and hash 0x%x; repository blocks are DAG-CBOR with SHA-256", ErrInvalidImport, c, pre.Version, pre.Codec, pre.MhType)
	}
	data := sec[n:]
	if len(data) > MaxImportBlockBytes {
		return cid.Undef, nil, nil, fmt.Errorf("%w: block %s is %s bytes; the largest accepted is %s", ErrInvalidImport, c, commas(len(data)), commas(MaxImportBlockBytes))
	}
	sum := sha256.Sum256(data)
	hash := c.Hash()
	if !bytes.Equal(hash[len(hash)-sha256.Size:], sum[:]) {
		return cid.Undef, nil, nil, fmt.Errorf("%w: the bytes of block %s do not match its CID", ErrInvalidImport, c)
	}
	cr.blocks++
	return c, sec[:n], data, nil
}
