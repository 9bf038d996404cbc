package repo

import (
	"bytes"
	"encoding/binary"

	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car/util"
)

// carBuilder assembles a CAR v1 in memory (for commit diffs and proofs,
// which are bounded; full exports stream instead, see ExportCAR).
type carBuilder struct {
	buf  bytes.Buffer
	seen map[cid.Cid]bool
}

func newCARBuilder(root cid.Cid) *carBuilder {
	b := &carBuilder{seen: map[cid.Cid]bool{}}
	b.buf.Write(appendCARHeader(nil, root))
	return b
}

// appendCARHeader appends the length-prefixed header of a CAR v1 with one
// root: the DAG-CBOR map {"roots": [root], "version": 1}, byte for byte
// what go-car's WriteHeader writes (TestCARHeader), without its
// reflection-driven encoder (12 µs of every commit's diff CAR).
func appendCARHeader(dst []byte, root cid.Cid) []byte {
	c := root.Bytes()
	link := len(c) + 1 // a CID link is tag 42 over 0x00 and the CID
	var hdr []byte
	hdr = append(hdr, 0xa2, 0x65, 'r', 'o', 'o', 't', 's', 0x81, 0xd8, 0x2a)
	switch {
	case link < 24:
		hdr = append(hdr, 0x40|byte(link))
	case link < 256:
		hdr = append(hdr, 0x58, byte(link))
	default:
		hdr = append(hdr, 0x59, byte(link>>8), byte(link))
	}
	hdr = append(hdr, 0x00)
	hdr = append(hdr, c...)
	hdr = append(hdr, 0x67, 'v', 'e', 'r', 's', 'i', 'o', 'n', 0x01)
	dst = binary.AppendUvarint(dst, uint64(len(hdr)))
	return append(dst, hdr...)
}

// add appends a block unless the CAR already holds it, and reports whether
// it did.
func (b *carBuilder) add(c cid.Cid, data []byte) bool {
	if b.seen[c] {
		return false
	}
	b.seen[c] = true
	_ = util.LdWrite(&b.buf, c.Bytes(), data)
	return true
}

func (b *carBuilder) bytes() []byte { return b.buf.Bytes() }
