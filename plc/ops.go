package plc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"unicode"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
)

// Bounds of an operation's fields. MaxRotationKeys is the did:plc
// specification's; the others bound what this server signs or forwards
// for a client (the directory has limits of its own, which it reports as
// a rejection).
const (
	// MaxRotationKeys is how many rotation keys an operation may list.
	MaxRotationKeys = 5
	// MaxEntries bounds alsoKnownAs, verificationMethods and services.
	MaxEntries = 10
	// MaxFieldLength bounds each string of an operation (a key, a URI,
	// a service type or endpoint, a map key).
	MaxFieldLength = 512
)

// maxErrorBody bounds how much of a directory's error answer is read.
const maxErrorBody = 4 << 10

// ErrInvalidOperation means an operation is malformed: a wrong type, a
// missing signature or prev, a key that is not a did:key, a field over its
// bound. The wrapping message says which.
var ErrInvalidOperation = errors.New("invalid plc operation")

// post submits op for did and tells a rejection (4xx: the operation is
// wrong) from a failure of the directory.
func (c *Client) post(ctx context.Context, did syntax.DID, op didplc.Operation) error {
	if did.Method() != "plc" {
		return fmt.Errorf("%w: %s is not a did:plc", ErrDirectory, did)
	}
	body, err := json.Marshal(op)
	if err != nil {
		return fmt.Errorf("%w: encoding the operation: %v", ErrDirectory, err)
	}
	url := strings.TrimRight(c.dir.DirectoryURL, "/") + "/" + did.String()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDirectory, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", c.dir.UserAgent)
	resp, err := c.dir.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrDirectory, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return fmt.Errorf("%w: %w: %s", ErrDirectory, ErrRejected, directoryMessage(raw))
	default:
		return fmt.Errorf("%w: HTTP %d: %s", ErrDirectory, resp.StatusCode, directoryMessage(raw))
	}
}

// directoryMessage is the "message" of a directory's JSON error, or its
// plain text, shortened and stripped of control characters (it may be
// shown to a client).
func directoryMessage(raw []byte) string {
	var body struct {
		Message string `json:"message"`
	}
	msg := string(raw)
	if json.Unmarshal(raw, &body) == nil && body.Message != "" {
		msg = body.Message
	}
	msg = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, msg)
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	return strings.TrimSpace(msg)
}

// Last returns did's current operation and its CID. A legacy genesis is
// returned in the current form; a tombstone is ErrTombstoned.
func (c *Client) Last(ctx context.Context, did syntax.DID) (*didplc.RegularOp, string, error) {
	log, err := c.dir.OpLog(ctx, did.String())
	if err != nil {
		return nil, "", fmt.Errorf("%w: reading the log of %s: %v", ErrDirectory, did, err)
	}
	if len(log) == 0 {
		return nil, "", fmt.Errorf("%w: %s has an empty log", ErrDirectory, did)
	}
	last := log[len(log)-1].AsOperation()
	switch op := last.(type) {
	case *didplc.RegularOp:
		return op, last.CID().String(), nil
	case *didplc.LegacyOp:
		reg := op.RegularOp()
		return &reg, last.CID().String(), nil
	case *didplc.TombstoneOp:
		return nil, "", fmt.Errorf("%w: %s", ErrTombstoned, did)
	default:
		return nil, "", fmt.Errorf("%w: %s: unknown operation in the log", ErrDirectory, did)
	}
}

// Controls reports whether op's rotation keys include this server's.
func (c *Client) Controls(op *didplc.RegularOp) bool {
	return slices.Contains(op.RotationKeys, c.rotationDID)
}

// signNext builds the operation that follows did's current one, with
// change applied, and signs it with the server's rotation key, which must
// be among the current rotation keys (else ErrNotControlled). Nothing is
// sent.
func (c *Client) signNext(ctx context.Context, did syntax.DID, change func(*didplc.RegularOp)) (*didplc.RegularOp, error) {
	prevOp, prev, err := c.Last(ctx, did)
	if errors.Is(err, ErrTombstoned) {
		return nil, fmt.Errorf("%w: %w", ErrNotControlled, err)
	}
	if err != nil {
		return nil, err
	}
	if !c.Controls(prevOp) {
		return nil, fmt.Errorf("%w: %s", ErrNotControlled, did)
	}
	next := &didplc.RegularOp{
		Type:                "plc_operation",
		RotationKeys:        slices.Clone(prevOp.RotationKeys),
		VerificationMethods: maps.Clone(prevOp.VerificationMethods),
		AlsoKnownAs:         slices.Clone(prevOp.AlsoKnownAs),
		Services:            maps.Clone(prevOp.Services),
		Prev:                &prev,
	}
	if next.VerificationMethods == nil {
		next.VerificationMethods = map[string]string{}
	}
	if next.Services == nil {
		next.Services = map[string]didplc.OpService{}
	}
	change(next)
	if err := next.Sign(c.rotationKey); err != nil {
		return nil, fmt.Errorf("signing plc operation: %w", err)
	}
	return next, nil
}

// Overrides replace fields of a DID's current operation in the next one
// (com.atproto.identity.signPlcOperation's input). A nil field keeps the
// current value.
type Overrides struct {
	RotationKeys        []string
	AlsoKnownAs         []string
	VerificationMethods map[string]string
	Services            map[string]didplc.OpService
}

// SignUpdate signs, with the server's rotation key, the operation that
// follows did's current one with o applied, and returns it without
// submitting it (the account's next PDS does that). The server's key must
// be among the current rotation keys (else ErrNotControlled); the result
// must pass CheckOperation (else ErrInvalidOperation).
func (c *Client) SignUpdate(ctx context.Context, did syntax.DID, o Overrides) (*didplc.RegularOp, error) {
	op, err := c.signNext(ctx, did, func(op *didplc.RegularOp) {
		if o.RotationKeys != nil {
			op.RotationKeys = slices.Clone(o.RotationKeys)
		}
		if o.AlsoKnownAs != nil {
			op.AlsoKnownAs = slices.Clone(o.AlsoKnownAs)
		}
		if o.VerificationMethods != nil {
			op.VerificationMethods = maps.Clone(o.VerificationMethods)
		}
		if o.Services != nil {
			op.Services = maps.Clone(o.Services)
		}
	})
	if err != nil {
		return nil, err
	}
	if err := CheckOperation(op); err != nil {
		return nil, err
	}
	return op, nil
}

// CheckOperation checks that op is a well-formed, signed update
// operation: a prev, and everything CheckSigned checks. It does not verify
// the signature (the directory does, against the log).
func CheckOperation(op *didplc.RegularOp) error {
	if op != nil && (op.Prev == nil || *op.Prev == "") {
		return fmt.Errorf("%w: an update needs prev (the CID of the operation it follows)", ErrInvalidOperation)
	}
	return CheckSigned(op)
}

// CheckSigned checks that op is a well-formed, signed operation, a
// genesis (no prev) or an update: type plc_operation, 1–MaxRotationKeys
// distinct rotation keys that parse as did:key, verification methods that
// look like did:key, services with a type and an endpoint, every field
// within its bound. It does not verify the signature.
func CheckSigned(op *didplc.RegularOp) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOperation, fmt.Sprintf(format, args...))
	}
	switch {
	case op == nil:
		return bad("no operation")
	case op.Type != "plc_operation":
		return bad("type must be plc_operation, not %q", op.Type)
	case op.Prev != nil && *op.Prev == "":
		return bad("prev is empty: a genesis operation has prev null")
	case op.Sig == nil || *op.Sig == "":
		return bad("the operation is not signed")
	case len(op.RotationKeys) == 0 || len(op.RotationKeys) > MaxRotationKeys:
		return bad("rotationKeys must list 1 to %d keys, not %d", MaxRotationKeys, len(op.RotationKeys))
	case len(op.AlsoKnownAs) > MaxEntries || len(op.VerificationMethods) > MaxEntries || len(op.Services) > MaxEntries:
		return bad("alsoKnownAs, verificationMethods and services may hold at most %d entries each", MaxEntries)
	}
	for i, k := range op.RotationKeys {
		if len(k) > MaxFieldLength || slices.Index(op.RotationKeys, k) != i {
			return bad("rotationKeys: %q is too long or listed twice", k)
		}
		if _, err := atcrypto.ParsePublicDIDKey(k); err != nil {
			return bad("rotationKeys: %q is not a did:key: %v", k, err)
		}
	}
	for _, a := range op.AlsoKnownAs {
		if a == "" || len(a) > MaxFieldLength {
			return bad("alsoKnownAs: entries must be 1 to %d bytes", MaxFieldLength)
		}
	}
	for id, k := range op.VerificationMethods {
		if id == "" || len(id) > MaxFieldLength || len(k) > MaxFieldLength || !strings.HasPrefix(k, "did:key:z") {
			return bad("verificationMethods.%.40q must be a did:key", id)
		}
	}
	for id, s := range op.Services {
		if id == "" || len(id) > MaxFieldLength || s.Type == "" || s.Endpoint == "" || len(s.Type) > MaxFieldLength || len(s.Endpoint) > MaxFieldLength {
			return bad("services.%.40q needs a type and an endpoint of at most %d bytes", id, MaxFieldLength)
		}
	}
	return nil
}
