package repo

import (
	"fmt"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"

	"github.com/bulwark-pds/bulwark/fastsyntax"
	"github.com/bulwark-pds/bulwark/limits"
)

// Action is what a Write does.
type Action string

// The three write actions of com.atproto.repo.applyWrites.
const (
	ActionCreate Action = "create"
	ActionUpdate Action = "update"
	ActionDelete Action = "delete"
)

// Swap is a compare-and-swap condition on a record: the write applies only
// if the record's current CID is CID, or, with CID nil, only if there is no
// record at the path.
type Swap struct {
	CID *cid.Cid
}

// Write is one operation of a commit.
type Write struct {
	Action     Action
	Collection syntax.NSID
	// RKey may be empty on create: the engine assigns a TID.
	RKey syntax.RecordKey
	// Record is the record's data (create and update), as parsed by
	// atdata.UnmarshalJSON. Its $type must equal Collection.
	Record map[string]any
	// SwapRecord, when set, must match the record's current state.
	SwapRecord *Swap
}

// WriteResult reports one applied write.
type WriteResult struct {
	Action     Action
	Collection syntax.NSID
	RKey       syntax.RecordKey
	// CID is the new record's CID; undefined for deletes.
	CID cid.Cid
}

// CommitResult reports a stored commit.
type CommitResult struct {
	Commit  cid.Cid
	Rev     string
	Results []WriteResult
	// moved is what the commit changed, for the other nodes' hints (nil
	// when it changed nothing).
	moved *movedFrom
}

var cidBuilder = cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256)

// preparedWrite is a Write with its record encoded and its path fixed.
type preparedWrite struct {
	Write
	path  string
	cid   cid.Cid
	block []byte
}

// prepare encodes records and checks every limit that does not need the
// tree, before any lock is taken.
func (e *Engine) prepare(writes []Write) ([]preparedWrite, error) {
	if len(writes) < 1 || len(writes) > limits.MaxCommitOps {
		return nil, &LimitError{Limit: LimitCommitOps, Size: len(writes), Max: limits.MaxCommitOps}
	}
	out := make([]preparedWrite, len(writes))
	seen := make(map[string]bool, len(writes))
	for i, w := range writes {
		pw := preparedWrite{Write: w}
		switch w.Action {
		case ActionCreate:
			if pw.RKey == "" {
				pw.RKey = syntax.RecordKey(e.clock.Load().Next().String())
			}
		case ActionUpdate, ActionDelete:
			if pw.RKey == "" {
				return nil, fmt.Errorf("%w: %s of %s needs an rkey", ErrInvalidWrite, w.Action, w.Collection)
			}
		default:
			return nil, fmt.Errorf("%w: unknown action %q", ErrInvalidWrite, w.Action)
		}
		if _, err := fastsyntax.ParseNSID(string(w.Collection)); err != nil {
			return nil, fmt.Errorf("%w: collection %q: %v", ErrInvalidWrite, w.Collection, err)
		}
		if _, err := fastsyntax.ParseRecordKey(string(pw.RKey)); err != nil {
			return nil, fmt.Errorf("%w: record key %q: %v", ErrInvalidWrite, pw.RKey, err)
		}
		pw.path = string(w.Collection) + "/" + string(pw.RKey)
		if !mst.IsValidKey([]byte(pw.path)) {
			return nil, fmt.Errorf("%w: %q is not a valid repository path", ErrInvalidWrite, pw.path)
		}
		if seen[pw.path] {
			return nil, fmt.Errorf("%w: %s is written twice in one commit", ErrInvalidWrite, pw.path)
		}
		seen[pw.path] = true
		if w.Action != ActionDelete {
			block, c, err := encodeRecord(pw.path, w.Collection, w.Record)
			if err != nil {
				return nil, err
			}
			pw.block, pw.cid = block, c
		}
		out[i] = pw
	}
	return out, nil
}

// encodeRecord checks a record's data and encodes it as a DAG-CBOR block,
// enforcing the per-record limits on the encoded bytes.
func encodeRecord(path string, collection syntax.NSID, rec map[string]any) ([]byte, cid.Cid, error) {
	if rec == nil {
		return nil, cid.Undef, fmt.Errorf("%w: %s has no record", ErrInvalidWrite, path)
	}
	typ, _ := rec["$type"].(string)
	if typ != string(collection) {
		return nil, cid.Undef, fmt.Errorf("%w: record $type %q does not match collection %q", ErrInvalidWrite, typ, collection)
	}
	block, err := atdata.MarshalCBOR(rec)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("%w: %s cannot be encoded as DAG-CBOR: %v", ErrInvalidWrite, path, err)
	}
	if len(block) <= limits.MaxRecordCBORBytes {
		// Check the data model on the bytes that will be stored (no floats,
		// valid blob and link shapes, depth and size bounds), whatever the
		// caller built the map from.
		if _, err := atdata.UnmarshalCBOR(block); err != nil {
			return nil, cid.Undef, fmt.Errorf("%w: %s is not valid atproto data: %v", ErrInvalidWrite, path, err)
		}
	}
	if len(block) > limits.MaxRecordCBORBytes {
		return nil, cid.Undef, &LimitError{Limit: LimitRecordCBOR, Path: path, Size: len(block), Max: limits.MaxRecordCBORBytes}
	}
	if len(block) > limits.MaxRecordBlockBytes {
		return nil, cid.Undef, &LimitError{Limit: LimitRecordBlock, Path: path, Size: len(block), Max: limits.MaxRecordBlockBytes}
	}
	c, err := cidBuilder.Sum(block)
	if err != nil {
		return nil, cid.Undef, err
	}
	return block, c, nil
}
