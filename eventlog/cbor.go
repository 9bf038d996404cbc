package eventlog

import (
	"encoding/binary"
	"errors"
	"fmt"
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
