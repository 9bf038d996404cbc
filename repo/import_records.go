package repo

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/ipfs/go-cid"
	cbor "github.com/ipfs/go-ipld-cbor"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/limits"
)

// Pages of the import's record check.
const (
	// recordPage is how many records one read returns.
	recordPage = 1000
	// recordPageBytes bounds the record bytes one read returns.
	recordPageBytes = 8 << 20
	// maxRecordDepth bounds how deeply an imported record nests maps and
	// arrays, checked on the bytes before any decoding: decoding is
	// recursive, and a 1 MiB record of nested arrays would otherwise
	// take hundreds of MiB of stack. Bluesky's records nest under ten
	// levels; indigo names 32 as the data model's nesting limit.
	maxRecordDepth = 64
)

// checkRecords reads the staged records in path order, a bounded page at
// a time, and checks each: its block is in the CAR, it is atproto data (a
// map with a $type) and within the per-record limits. It records their
// blob references through blobs (nil: none), and refuses the import if a
// record is over the limits and the options do not allow that.
func (imp *importer) checkRecords(ctx context.Context, blobs BlobImporter, rev string) error {
	var over []OversizeRecord
	total := 0
	cursor := ""
	for {
		var refs []BlobRef
		rows, err := imp.tx.Query(ctx, qImportRecordPage, cursor, recordPage, recordPageBytes)
		if err != nil {
			return fmt.Errorf("reading staged records: %w", db.Translate(err))
		}
		n := 0
		var path string
		var rawCID, data []byte
		_, err = pgx.ForEachRow(rows, []any{&path, &rawCID, &data}, func() error {
			n++
			cursor = path
			if data == nil {
				c, _ := cid.Cast(rawCID)
				return fmt.Errorf("%w: the CAR lacks the block %s of record %s", ErrInvalidImport, c, path)
			}
			if len(data) > limits.MaxRecordBlockBytes {
				total++
				if len(over) < maxListedOversize {
					over = append(over, OversizeRecord{Path: path, Size: len(data)})
				}
				if !imp.opts.AllowOversize {
					return nil // refused below, once all are counted
				}
			}
			found, err := recordBlobRefs(path, data)
			refs = append(refs, found...)
			return err
		})
		if err != nil {
			if errors.Is(err, ErrInvalidImport) {
				return err
			}
			return fmt.Errorf("reading staged records: %w", db.Translate(err))
		}
		if n == 0 {
			break
		}
		if blobs != nil && len(refs) > 0 && (total == 0 || imp.opts.AllowOversize) {
			if err := blobs.AddRefsTx(ctx, imp.tx, imp.did, rev, refs); err != nil {
				return err
			}
			imp.res.BlobRefs += int64(len(refs))
		}
	}
	if total > 0 && !imp.opts.AllowOversize {
		return &OversizeRecordsError{Records: over, Total: total}
	}
	imp.res.Oversize, imp.res.OversizeTotal = over, total
	return nil
}

// recordBlobRefs checks one record's block against the data model and
// returns the blobs it refers to, each once. A record over the data
// model's size limit (imported because the operator allows it) is checked
// with the same rules, decoded without atdata's size cap.
func recordBlobRefs(path string, data []byte) ([]BlobRef, error) {
	if err := checkDepth(data, maxRecordDepth); err != nil {
		return nil, fmt.Errorf("%w: record %s: %v", ErrInvalidImport, path, err)
	}
	var found []cid.Cid
	if len(data) <= limits.MaxRecordCBORBytes {
		rec, err := atdata.UnmarshalCBOR(data)
		if err != nil {
			return nil, fmt.Errorf("%w: record %s is not valid atproto data: %v", ErrInvalidImport, path, err)
		}
		if typ, _ := rec["$type"].(string); typ == "" {
			return nil, fmt.Errorf("%w: record %s has no $type", ErrInvalidImport, path)
		}
		for _, b := range atdata.ExtractBlobs(rec) {
			found = append(found, b.Ref.CID())
		}
	} else {
		var raw map[string]any
		if err := cbor.DecodeInto(data, &raw); err != nil {
			return nil, fmt.Errorf("%w: record %s is not valid DAG-CBOR: %v", ErrInvalidImport, path, err)
		}
		if err := atdata.Validate(raw); err != nil {
			return nil, fmt.Errorf("%w: record %s is not valid atproto data: %v", ErrInvalidImport, path, err)
		}
		if typ, _ := raw["$type"].(string); typ == "" {
			return nil, fmt.Errorf("%w: record %s has no $type", ErrInvalidImport, path)
		}
		found = rawBlobs(raw, found)
	}
	var refs []BlobRef
	seen := make(map[cid.Cid]bool, len(found))
	for _, c := range found {
		if !c.Defined() || seen[c] {
			continue
		}
		seen[c] = true
		refs = append(refs, BlobRef{Path: path, CID: c.String()})
	}
	return refs, nil
}

// rawBlobs appends the blobs of undecoded (go-ipld-cbor) data to out:
// {$type: blob, ref: link, ...} and the legacy {cid, mimeType}, as
// atdata.ExtractBlobs finds them in decoded data.
func rawBlobs(v any, out []cid.Cid) []cid.Cid {
	switch v := v.(type) {
	case map[string]any:
		if v["$type"] == "blob" {
			if c, ok := v["ref"].(cid.Cid); ok {
				return append(out, c)
			}
		}
		if s, ok := v["cid"].(string); ok && len(v) == 2 && v["mimeType"] != nil {
			if c, err := cid.Decode(s); err == nil {
				return append(out, c)
			}
		}
		for _, el := range v {
			out = rawBlobs(el, out)
		}
	case []any:
		for _, el := range v {
			out = rawBlobs(el, out)
		}
	}
	return out
}

// errCBORTruncated means a CBOR item runs past the end of its bytes.
var errCBORTruncated = errors.New("truncated CBOR")

// checkDepth scans one CBOR item without decoding it and refuses it when
// maps and arrays nest deeper than max, or when it uses indefinite
// lengths (not DAG-CBOR). It keeps one counter per open container.
func checkDepth(data []byte, max int) error {
	// pending[i] is how many items the i-th open container still holds.
	pending := []uint64{1}
	for len(pending) > 0 {
		if pending[len(pending)-1] == 0 {
			pending = pending[:len(pending)-1]
			continue
		}
		pending[len(pending)-1]--
		if len(data) == 0 {
			return errCBORTruncated
		}
		major, info := data[0]>>5, data[0]&0x1f
		data = data[1:]
		var arg uint64
		switch {
		case info < 24:
			arg = uint64(info)
		case info <= 27:
			n := 1 << (info - 24)
			if len(data) < n {
				return errCBORTruncated
			}
			var b [8]byte
			copy(b[8-n:], data[:n])
			arg = binary.BigEndian.Uint64(b[:])
			data = data[n:]
		default:
			return fmt.Errorf("CBOR with indefinite lengths or reserved values is not DAG-CBOR")
		}
		switch major {
		case 2, 3: // byte and text strings
			if arg > uint64(len(data)) {
				return errCBORTruncated
			}
			data = data[arg:]
		case 4, 5, 6: // arrays, maps (two items an entry), tags (one item)
			if major == 5 {
				if arg > uint64(len(data)) {
					return errCBORTruncated
				}
				arg *= 2
			} else if major == 6 {
				arg = 1
			}
			if arg > uint64(len(data)) {
				return errCBORTruncated
			}
			if len(pending) > max {
				return fmt.Errorf("data nests more than %d levels deep", max)
			}
			pending = append(pending, arg)
		}
	}
	return nil
}
