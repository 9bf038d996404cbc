package repo

import (
	"bytes"

	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
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
	// Writing to a bytes.Buffer cannot fail.
	_ = car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{root}, Version: 1}, &b.buf)
	return b
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
