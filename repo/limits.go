package repo

import (
	"errors"
	"fmt"
)

// Sentinel errors. Handlers map these to XRPC error names with errors.Is.
var (
	// ErrRepoNotFound means no repository is hosted for the DID.
	ErrRepoNotFound = errors.New("repository not found")
	// ErrRepoExists means a repository already exists for the DID.
	ErrRepoExists = errors.New("repository already exists")
	// ErrRecordNotFound means the record does not exist.
	ErrRecordNotFound = errors.New("record not found")
	// ErrRecordExists means a create targeted a path that already holds a record.
	ErrRecordExists = errors.New("record already exists")
	// ErrInvalidSwap means a swapCommit or swapRecord did not match.
	ErrInvalidSwap = errors.New("invalid swap")
	// ErrInvalidWrite means a write is malformed (bad path, duplicate path in
	// one commit, record data that is not valid atproto data).
	ErrInvalidWrite = errors.New("invalid write")
	// ErrLimitExceeded is wrapped by every *LimitError.
	ErrLimitExceeded = errors.New("protocol limit exceeded")
	// ErrCorruptRepo means the stored repository failed an integrity check
	// (missing MST nodes, root mismatch). It is a server fault, never the
	// caller's.
	ErrCorruptRepo = errors.New("stored repository is inconsistent")
)

// Limit names a protocol limit in a LimitError.
type Limit string

// The limits a write can break.
const (
	LimitRecordCBOR   Limit = "record DAG-CBOR size"
	LimitRecordBlock  Limit = "record block size in a commit"
	LimitCommitBlocks Limit = "commit blocks size"
	LimitCommitOps    Limit = "operations per commit"
	LimitFrame        Limit = "event-stream frame size"
)

// LimitError reports a write refused because it breaks a protocol limit. Its
// message names the limit and the actual size so a person can act on it.
type LimitError struct {
	Limit  Limit
	Path   string // record path, for per-record limits
	Size   int
	Max    int
	Detail string
}

func (e *LimitError) Error() string {
	switch e.Limit {
	case LimitRecordCBOR:
		return fmt.Sprintf("record %s is %s bytes of DAG-CBOR; the limit is %s bytes per record", e.Path, commas(e.Size), commas(e.Max))
	case LimitRecordBlock:
		return fmt.Sprintf("record %s is %s bytes of DAG-CBOR; the limit is %s per record in a commit", e.Path, commas(e.Size), commas(e.Max))
	case LimitCommitBlocks:
		return fmt.Sprintf("this commit's blocks come to %s bytes (%s); the limit is %s bytes per commit: split the writes into several requests", commas(e.Size), e.Detail, commas(e.Max))
	case LimitCommitOps:
		if e.Size < 1 {
			return "a commit needs at least one write"
		}
		return fmt.Sprintf("%s writes in one commit; the limit is %s", commas(e.Size), commas(e.Max))
	case LimitFrame:
		return fmt.Sprintf("this commit's event frame would be %s bytes; the limit is %s bytes", commas(e.Size), commas(e.Max))
	}
	return fmt.Sprintf("%s: %s bytes; the limit is %s", e.Limit, commas(e.Size), commas(e.Max))
}

// Unwrap makes errors.Is(err, ErrLimitExceeded) true.
func (e *LimitError) Unwrap() error { return ErrLimitExceeded }

// commas formats n with thousands separators, as the limits are written in
// the specs.
func commas(n int) string {
	s := fmt.Sprintf("%d", n)
	neg := false
	if n < 0 {
		neg, s = true, s[1:]
	}
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
