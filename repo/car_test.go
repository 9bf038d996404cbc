package repo

import (
	"bytes"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"
)

// appendCARHeader writes exactly the bytes go-car writes, for CIDs whose
// link takes each length form of a CBOR byte string.
func TestCARHeader(t *testing.T) {
	t.Parallel()
	sum := func(code uint64, length int, data string) multihash.Multihash {
		h, err := multihash.Sum([]byte(data), code, length)
		require.NoError(t, err)
		return h
	}
	roots := []cid.Cid{
		cid.NewCidV1(cid.DagCBOR, sum(multihash.SHA2_256, -1, "commit")), // 36 bytes
		cid.NewCidV1(cid.Raw, sum(multihash.SHA2_256, -1, "blob")),
		cid.NewCidV1(cid.DagCBOR, sum(multihash.IDENTITY, -1, "tiny")),                    // link < 24 bytes
		cid.NewCidV1(cid.DagCBOR, sum(multihash.SHA2_512, -1, "long")),                    // 68 bytes
		cid.NewCidV1(cid.DagCBOR, sum(multihash.IDENTITY, -1, string(make([]byte, 300)))), // link > 255 bytes
	}
	for _, root := range roots {
		var want bytes.Buffer
		require.NoError(t, car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{root}, Version: 1}, &want))
		got := appendCARHeader([]byte("prefix"), root)
		require.Equal(t, "prefix", string(got[:6]))
		require.Equal(t, want.Bytes(), got[6:], "root %s", root)

		r, err := car.NewCarReader(bytes.NewReader(got[6:]))
		require.NoError(t, err)
		require.Equal(t, []cid.Cid{root}, r.Header.Roots)
	}
}
