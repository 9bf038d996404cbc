// Package eventlogtest makes the stored events a bug or an import could
// leave behind, for tests of what the server and the relays do with them.
package eventlogtest

import (
	"bytes"
	"encoding/binary"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
)

// fillerCID is a raw-codec CIDv1 (sha2-256) header for the filler block;
// nothing reads the block, so its digest need not match.
var fillerCID = append([]byte{0x01, 0x55, 0x12, 0x20}, make([]byte, 32)...)

// InflateCommit takes a stored #commit event's body (as in the events
// table) and returns it with a filler block of n bytes after its real
// blocks: a frame over what relays read. The signed commit stays
// the first root, so a #sync made from it is genuine. It returns the new
// body, seq offset and blocks length, the columns of the row to update.
//
// cbor-gen will not encode byte strings over 2 MiB, so the commit is
// encoded with a marker for its blocks and the blocks spliced in.
func InflateCommit(t testing.TB, body []byte, n int) (newBody []byte, seqOffset, blocksLen int) {
	t.Helper()
	// A stored body is the whole CBOR of the event, its seq a placeholder
	// that EncodeCommit writes again.
	var c comatproto.SyncSubscribeRepos_Commit
	require.NoError(t, c.UnmarshalCBOR(bytes.NewReader(body)))
	filler := bytes.Repeat([]byte{0xa0}, n)
	blocks := append([]byte{}, c.Blocks...)
	blocks = binary.AppendUvarint(blocks, uint64(len(fillerCID)+len(filler)))
	blocks = append(append(blocks, fillerCID...), filler...)

	marker := []byte("BLOCKS-PLACEHOLDER:") // under 24 bytes: a one-byte head
	c.Blocks = marker
	enc, err := eventlog.EncodeCommit(&c)
	require.NoError(t, err)
	at := bytes.Index(enc.Body, marker) - 1
	out := append([]byte{}, enc.Body[:at]...)
	out = append(out, 0x5a) // a byte string with a 4-byte length
	out = binary.BigEndian.AppendUint32(out, uint32(len(blocks)))
	out = append(out, blocks...)
	out = append(out, enc.Body[at+1+len(marker):]...)
	return out, enc.SeqOffset, len(blocks)
}
