package eventlog

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	cbg "github.com/whyrusleeping/cbor-gen"
)

// Kind is the type of a stored event, without the leading '#'.
type Kind string

// The event kinds Bulwark stores. #info and error frames are never stored.
const (
	KindCommit   Kind = "commit"
	KindSync     Kind = "sync"
	KindIdentity Kind = "identity"
	KindAccount  Kind = "account"
)

// seqPlaceholder is stored in place of an event's seq: the largest int64,
// which CBOR encodes in the full 9 bytes, so the real seq always fits.
const seqPlaceholder = math.MaxInt64

// seqPlaceholderLen is the encoded size of seqPlaceholder.
const seqPlaceholderLen = 9

// seqKeyPattern is the "seq" map key followed by the placeholder value.
var seqKeyPattern = []byte{0x63, 's', 'e', 'q', 0x1b, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Encoded is an event body ready to store: DAG-CBOR with the seq placeholder
// at SeqOffset.
type Encoded struct {
	Kind      Kind
	DID       string
	Rev       string
	Body      []byte
	SeqOffset int
	BlocksLen int
	OpsCount  int
}

// FrameSize is the size of the frame this event becomes on the wire, at most.
func (e *Encoded) FrameSize() int {
	return len(headerBytes[e.Kind]) + len(e.Body)
}

// RevArg is the event's rev as the events.rev column takes it: NULL for
// events without one (#identity, #account).
func (e *Encoded) RevArg() *string {
	if e.Rev == "" {
		return nil
	}
	return &e.Rev
}

// EncodeCommit encodes a #commit body. Seq is ignored.
func EncodeCommit(ev *comatproto.SyncSubscribeRepos_Commit) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindCommit, ev.Repo, ev.Rev, len(ev.Blocks), len(ev.Ops), c.MarshalCBOR)
}

// EncodeSync encodes a #sync body. Seq is ignored.
func EncodeSync(ev *comatproto.SyncSubscribeRepos_Sync) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindSync, ev.Did, ev.Rev, len(ev.Blocks), 0, c.MarshalCBOR)
}

// EncodeIdentity encodes an #identity body. Seq is ignored.
func EncodeIdentity(ev *comatproto.SyncSubscribeRepos_Identity) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindIdentity, ev.Did, "", 0, 0, c.MarshalCBOR)
}

// EncodeAccount encodes an #account body. Seq is ignored.
func EncodeAccount(ev *comatproto.SyncSubscribeRepos_Account) (*Encoded, error) {
	c := *ev
	c.Seq = seqPlaceholder
	return encode(KindAccount, ev.Did, "", 0, 0, c.MarshalCBOR)
}

func encode(kind Kind, did, rev string, blocksLen, opsCount int, marshal func(w io.Writer) error) (*Encoded, error) {
	var buf bytes.Buffer
	if err := marshal(&buf); err != nil {
		return nil, fmt.Errorf("encoding #%s event: %w", kind, err)
	}
	body := buf.Bytes()
	// "seq" sorts before every longer key and after only "ops" and "rev",
	// whose values cannot contain the placeholder bytes (0xff is never
	// valid UTF-8), so the first match is the field itself.
	i := bytes.Index(body, seqKeyPattern)
	if i < 0 {
		return nil, fmt.Errorf("encoding #%s event: seq field not found", kind)
	}
	return &Encoded{
		Kind:      kind,
		DID:       did,
		Rev:       rev,
		Body:      body,
		SeqOffset: i + 4,
		BlocksLen: blocksLen,
		OpsCount:  opsCount,
	}, nil
}

// Event is a sequenced event read back from the log.
type Event struct {
	Seq       int64
	DID       string
	Kind      Kind
	Rev       string
	CreatedAt time.Time
	Body      []byte
	SeqOffset int
	BlocksLen int
	OpsCount  int
}

// FrameSize is the size of the frame this event becomes on the wire, at most.
func (e *Event) FrameSize() int {
	return len(headerBytes[e.Kind]) + len(e.Body)
}

// headerBytes holds the encoded frame header {op: 1, t: "#kind"} per kind.
var headerBytes = map[Kind][]byte{}

func init() {
	for _, k := range []Kind{KindCommit, KindSync, KindIdentity, KindAccount} {
		headerBytes[k] = FrameHeader(1, "#"+string(k))
	}
}

// FrameHeader encodes an event-stream frame header: a DAG-CBOR map with
// keys in canonical order ("t" before "op"). Stored events have op 1 and
// t "#kind"; error frames op -1 and no t (pass "").
func FrameHeader(op int64, t string) []byte {
	var buf bytes.Buffer
	cw := cbg.NewCborWriter(&buf)
	n := uint64(2)
	if t == "" {
		n = 1
	}
	_ = cw.WriteMajorTypeHeader(cbg.MajMap, n)
	if t != "" {
		_ = cw.WriteMajorTypeHeader(cbg.MajTextString, 1)
		_, _ = cw.WriteString("t")
		_ = cw.WriteMajorTypeHeader(cbg.MajTextString, uint64(len(t)))
		_, _ = cw.WriteString(t)
	}
	_ = cw.WriteMajorTypeHeader(cbg.MajTextString, 2)
	_, _ = cw.WriteString("op")
	if op < 0 {
		_ = cw.WriteMajorTypeHeader(cbg.MajNegativeInt, uint64(-op-1))
	} else {
		_ = cw.WriteMajorTypeHeader(cbg.MajUnsignedInt, uint64(op))
	}
	return buf.Bytes()
}

// AppendFrame appends the wire frame of a stored event with its seq to dst
// and returns the extended slice. No decoding: the seq placeholder is
// replaced in place.
func AppendFrame(dst []byte, kind Kind, body []byte, seqOffset int, seq int64) []byte {
	dst = append(dst, headerBytes[kind]...)
	dst = append(dst, body[:seqOffset]...)
	dst = appendCBORUint(dst, uint64(seq))
	return append(dst, body[seqOffset+seqPlaceholderLen:]...)
}

func appendCBORUint(dst []byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0x18, byte(v))
	case v <= math.MaxUint16:
		return append(dst, 0x19, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return append(dst, 0x1a, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		return append(dst, 0x1b, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
}
