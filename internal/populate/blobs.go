package populate

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"

	"github.com/ipfs/go-cid"

	"github.com/bulwark-pds/bulwark/blob"
)

// Blob is an uploaded image accounts' records refer to (avatars, post
// images). Accounts share a pool of them: the same bytes uploaded by many
// accounts are one stored object and one row per account, as the blobs
// table keeps them.
type Blob struct {
	CID  cid.Cid
	Mime string
	Size int64
}

// MakeBlobs makes n small PNG images from seed and, with a store, stores
// them under their CIDs as the blob service does.
func MakeBlobs(ctx context.Context, seed uint64, n int, store blob.Store) ([]Blob, error) {
	r := rand.New(rand.NewPCG(seed, 0x626c6f62))
	out := make([]Blob, 0, n)
	for range n {
		img := image.NewRGBA(image.Rect(0, 0, 64+r.IntN(64), 64+r.IntN(64)))
		for i := range img.Pix {
			img.Pix[i] = byte(r.Uint32())
		}
		img.Set(0, 0, color.RGBA{A: 255})
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			return nil, err
		}
		c := blob.ComputeCID(buf.Bytes())
		b := Blob{CID: c, Mime: "image/png", Size: int64(buf.Len())}
		if store != nil {
			if err := put(ctx, store, c.String(), buf.Bytes()); err != nil {
				return nil, fmt.Errorf("storing blob %s: %w", c, err)
			}
		}
		out = append(out, b)
	}
	return out, nil
}

func put(ctx context.Context, store blob.Store, key string, data []byte) error {
	w, err := store.Create(ctx)
	if err != nil {
		return err
	}
	defer w.Close()
	if _, err := w.Write(data); err != nil {
		return err
	}
	return w.Commit(ctx, key)
}
