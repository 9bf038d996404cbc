package eventlog

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ipfs/go-cid"
)

// storedFields are the parts of a stored #commit or #sync body that a
// replacement #sync needs.
type storedFields struct {
	did, rev, time string
	blocks         []byte
}

var errMalformedBody = errors.New("malformed event body")

// readStoredFields pulls repo/did, rev, time and blocks out of a stored event
// body. It is a minimal DAG-CBOR reader rather than cbor-gen's generated
// decoder because the events it exists for are the broken ones: cbor-gen
// refuses byte strings over 2 MiB, and an oversized #commit (imported, or
// written by older software) has exactly that.
func readStoredFields(body []byte) (storedFields, error) {
	var f storedFields
	r := cborReader{b: body}
	major, n, err := r.head()
	if err != nil {
		return f, err
	}
	if major != 5 {
		return f, fmt.Errorf("%w: not a map", errMalformedBody)
	}
	for range n {
		km, kl, err := r.head()
		if err != nil {
			return f, err
		}
		if km != 3 {
			return f, fmt.Errorf("%w: non-text key", errMalformedBody)
		}
		key, err := r.take(kl)
		if err != nil {
			return f, err
		}
		switch string(key) {
		case "repo", "did", "rev", "time":
			vm, vl, err := r.head()
			if err != nil {
				return f, err
			}
			if vm != 3 {
				return f, fmt.Errorf("%w: %s is not text", errMalformedBody, key)
			}
			v, err := r.take(vl)
			if err != nil {
				return f, err
			}
			switch string(key) {
			case "repo", "did":
				f.did = string(v)
			case "rev":
				f.rev = string(v)
			case "time":
				f.time = string(v)
			}
		case "blocks":
			vm, vl, err := r.head()
			if err != nil {
				return f, err
			}
			if vm != 2 {
				return f, fmt.Errorf("%w: blocks is not bytes", errMalformedBody)
			}
			if f.blocks, err = r.take(vl); err != nil {
				return f, err
			}
		default:
			if err := r.skip(0); err != nil {
				return f, err
			}
		}
	}
	return f, nil
}

type cborReader struct {
	b   []byte
	off int
}

// head reads one item head: major type and argument (length, count or
// value).
func (r *cborReader) head() (major byte, arg uint64, err error) {
	if r.off >= len(r.b) {
		return 0, 0, fmt.Errorf("%w: truncated", errMalformedBody)
	}
	ib := r.b[r.off]
	r.off++
	major, info := ib>>5, ib&0x1f
	switch {
	case info < 24:
		return major, uint64(info), nil
	case info <= 27:
		size := 1 << (info - 24)
		if r.off+size > len(r.b) {
			return 0, 0, fmt.Errorf("%w: truncated", errMalformedBody)
		}
		var buf [8]byte
		copy(buf[8-size:], r.b[r.off:r.off+size])
		r.off += size
		return major, binary.BigEndian.Uint64(buf[:]), nil
	}
	return 0, 0, fmt.Errorf("%w: indefinite or reserved length", errMalformedBody)
}

func (r *cborReader) take(n uint64) ([]byte, error) {
	if n > uint64(len(r.b)-r.off) {
		return nil, fmt.Errorf("%w: truncated", errMalformedBody)
	}
	v := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return v, nil
}

// skip passes over one whole item.
func (r *cborReader) skip(depth int) error {
	if depth > 64 {
		return fmt.Errorf("%w: nested too deeply", errMalformedBody)
	}
	major, arg, err := r.head()
	if err != nil {
		return err
	}
	switch major {
	case 0, 1, 7:
		return nil
	case 2, 3:
		_, err := r.take(arg)
		return err
	case 4:
		for range arg {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
	case 5:
		for range 2 * arg {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
	case 6:
		return r.skip(depth + 1)
	}
	return nil
}

// Op is one operation of a stored #commit: what happened at which path,
// and the CID of the record after it (none for a delete) and before it
// (when the commit says).
type Op struct {
	Action string `json:"action"`
	Path   string `json:"path"`
	CID    string `json:"cid,omitempty"`
	Prev   string `json:"prev,omitempty"`
}

// readOps pulls the ops out of a stored #commit body with the same minimal
// reader, so an oversized commit can be shown too.
func readOps(body []byte) ([]Op, error) {
	r := cborReader{b: body}
	major, n, err := r.head()
	if err != nil {
		return nil, err
	}
	if major != 5 {
		return nil, fmt.Errorf("%w: not a map", errMalformedBody)
	}
	for range n {
		key, err := r.text()
		if err != nil {
			return nil, err
		}
		if key != "ops" {
			if err := r.skip(0); err != nil {
				return nil, err
			}
			continue
		}
		am, count, err := r.head()
		if err != nil {
			return nil, err
		}
		if am != 4 || count > uint64(len(body)) {
			return nil, fmt.Errorf("%w: ops is not an array", errMalformedBody)
		}
		ops := make([]Op, 0, min(count, 256))
		for range count {
			op, err := r.op()
			if err != nil {
				return nil, err
			}
			ops = append(ops, op)
		}
		return ops, nil
	}
	return nil, nil
}

// op reads one repoOp map.
func (r *cborReader) op() (Op, error) {
	var op Op
	major, n, err := r.head()
	if err != nil {
		return op, err
	}
	if major != 5 {
		return op, fmt.Errorf("%w: op is not a map", errMalformedBody)
	}
	for range n {
		key, err := r.text()
		if err != nil {
			return op, err
		}
		switch key {
		case "action":
			op.Action, err = r.text()
		case "path":
			op.Path, err = r.text()
		case "cid":
			op.CID, err = r.link()
		case "prev":
			op.Prev, err = r.link()
		default:
			err = r.skip(0)
		}
		if err != nil {
			return op, err
		}
	}
	return op, nil
}

// text reads a text string.
func (r *cborReader) text() (string, error) {
	major, n, err := r.head()
	if err != nil {
		return "", err
	}
	if major != 3 {
		return "", fmt.Errorf("%w: expected text", errMalformedBody)
	}
	v, err := r.take(n)
	return string(v), err
}

// link reads a CID link (tag 42) or null as a CID string ("" for null).
func (r *cborReader) link() (string, error) {
	major, arg, err := r.head()
	if err != nil {
		return "", err
	}
	if major == 7 && arg == 22 {
		return "", nil
	}
	if major != 6 || arg != 42 {
		return "", fmt.Errorf("%w: expected a CID link", errMalformedBody)
	}
	bm, n, err := r.head()
	if err != nil {
		return "", err
	}
	b, err := r.take(n)
	if err != nil {
		return "", err
	}
	if bm != 2 || len(b) < 2 || b[0] != 0 {
		return "", fmt.Errorf("%w: malformed CID link", errMalformedBody)
	}
	c, err := cid.Cast(b[1:])
	if err != nil {
		return "", fmt.Errorf("%w: %v", errMalformedBody, err)
	}
	return c.String(), nil
}
