package eventlog

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	car "github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"

	"github.com/bulwark-pds/bulwark/limits"
)

// errNoCommitBlock means a stored event's CAR lacks the block of its first
// root.
var errNoCommitBlock = errors.New("commit block not found in event blocks")

// Oversized reports whether ev must not go on the wire as stored: its frame
// would exceed limits.MaxFrameBytes, or its blocks or ops exceed what relays
// accept (relays drop such an event, so it is never sent as stored).
// Such events (imported, legacy or repaired) are served as #sync.
func Oversized(ev *Event) bool {
	if ev.FrameSize() > limits.MaxFrameBytes {
		return true
	}
	switch ev.Kind {
	case KindCommit:
		return ev.BlocksLen > limits.MaxCommitBlocksBytes || ev.OpsCount > limits.MaxCommitOps
	case KindSync:
		return ev.BlocksLen > limits.MaxSyncBlocksBytes
	}
	return false
}

// SyncFrame builds the #sync frame that replaces an oversized #commit or
// #sync: same seq, repo and rev, with a CAR holding only the signed commit
// block, which tells consumers to re-fetch the repo with getRepo. The stored
// body is read with the minimal reader of syncFromStored, since cbor-gen
// refuses the byte strings over 2 MiB such events carry.
func SyncFrame(ev *Event) ([]byte, error) {
	body, err := syncFromStored(ev)
	if err != nil {
		return nil, err
	}
	body.Seq = ev.Seq
	if body.Time == "" {
		body.Time = syntax.DatetimeNow().String()
	}
	var buf bytes.Buffer
	buf.Write(headerBytes[KindSync])
	if err := body.MarshalCBOR(&buf); err != nil {
		return nil, fmt.Errorf("encoding #sync: %w", err)
	}
	return buf.Bytes(), nil
}

// commitOnlyCAR returns a CAR of the commit block alone (the first root of
// carBytes).
func commitOnlyCAR(carBytes []byte) ([]byte, error) {
	cr, err := car.NewCarReader(bytes.NewReader(carBytes))
	if err != nil {
		return nil, fmt.Errorf("reading event blocks: %w", err)
	}
	if len(cr.Header.Roots) == 0 {
		return nil, errNoCommitBlock
	}
	root := cr.Header.Roots[0]
	for {
		blk, err := cr.Next()
		if errors.Is(err, io.EOF) {
			return nil, errNoCommitBlock
		}
		if err != nil {
			return nil, fmt.Errorf("reading event blocks: %w", err)
		}
		if blk.Cid().Equals(root) {
			return singleBlockCAR(root, blk.RawData())
		}
	}
}

func singleBlockCAR(root cid.Cid, data []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{root}, Version: 1}, &buf); err != nil {
		return nil, err
	}
	if err := carutil.LdWrite(&buf, root.Bytes(), data); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
