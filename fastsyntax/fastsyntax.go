// Package fastsyntax parses the atproto identifiers every write carries
// (collection NSIDs, record keys) without running a regular expression on
// the hot path: indigo's syntax package validates each with a regexp,
// ~15 µs per NSID and ~7 µs per record key, paid several times per
// createRecord. Results are exactly indigo's: an NSID is checked by
// syntax.ParseNSID once and remembered; a record key's grammar is a set of
// ASCII bytes, checked by a loop, and anything the loop refuses goes to
// syntax.ParseRecordKey for its error.
package fastsyntax

import (
	"sync"
	"sync/atomic"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// maxRemembered bounds the NSIDs kept: a client inventing collection names
// cannot grow the set without limit (past it, parsing just is not cached).
const maxRemembered = 4096

var (
	nsids     sync.Map // string -> struct{}: NSIDs that parsed
	nsidCount atomic.Int64
)

// ParseNSID is syntax.ParseNSID, remembering the NSIDs that parse.
func ParseNSID(raw string) (syntax.NSID, error) {
	if _, ok := nsids.Load(raw); ok {
		return syntax.NSID(raw), nil
	}
	n, err := syntax.ParseNSID(raw)
	if err != nil {
		return "", err
	}
	if nsidCount.Load() < maxRemembered {
		if _, loaded := nsids.LoadOrStore(raw, struct{}{}); !loaded {
			nsidCount.Add(1)
		}
	}
	return n, nil
}

// ParseRecordKey is syntax.ParseRecordKey: 1 to 512 of the bytes
// A-Z a-z 0-9 _ ~ . : -, and neither "." nor "..".
func ParseRecordKey(raw string) (syntax.RecordKey, error) {
	if len(raw) == 0 || len(raw) > 512 || raw == "." || raw == ".." {
		return syntax.ParseRecordKey(raw)
	}
	for i := 0; i < len(raw); i++ {
		if !rkeyByte[raw[i]] {
			return syntax.ParseRecordKey(raw)
		}
	}
	return syntax.RecordKey(raw), nil
}

var rkeyByte = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "_~.:-" {
		t[c] = true
	}
	return t
}()
