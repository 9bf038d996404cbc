package lexresolve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/outbound"
)

// SchemaCollection is the collection lexicon schemas are published in;
// the record key is the NSID.
const SchemaCollection = "com.atproto.lexicon.schema"

// Errors. Every error Resolve returns wraps one of them; what the
// resolution met (addresses, DNS answers, bytes) is in the rest of the
// message, for the log, not for whoever asked.
var (
	// ErrNotFound means nothing is published for the NSID: no _lexicon
	// record, a DID that does not resolve or has no PDS or key, or no
	// such record in the repository.
	ErrNotFound = errors.New("lexicon not published")
	// ErrInvalid means something was published but cannot be believed or
	// used: the proof or its signature does not verify, or the record is
	// not a lexicon document for the NSID.
	ErrInvalid = errors.New("lexicon record invalid")
	// ErrFailed means resolution failed on the way (DNS or network error,
	// timeout, server error): a later try may succeed.
	ErrFailed = errors.New("lexicon resolution failed")
)

// DIDResolver returns a DID's document (outbound.Directory).
type DIDResolver interface {
	ResolveDID(ctx context.Context, did syntax.DID) (*identity.DIDDocument, error)
}

// Resolver resolves NSIDs to their published, verified lexicon documents.
// It keeps nothing: callers cache.
type Resolver struct {
	web  *outbound.Client
	dids DIDResolver
}

// New returns a resolver that looks up authorities and fetches proofs
// through web and resolves DIDs with dids.
func New(web *outbound.Client, dids DIDResolver) *Resolver {
	return &Resolver{web: web, dids: dids}
}

// Schema is a resolved lexicon document.
type Schema struct {
	NSID syntax.NSID
	// URI is where it is published: at://<did>/com.atproto.lexicon.schema/<nsid>.
	URI syntax.ATURI
	// CID is the record's CID in the signed tree.
	CID string
	// Document is the record as JSON (its $type included).
	Document json.RawMessage
}

// Resolve finds nsid's publisher, fetches the record with its proof from
// the publisher's PDS, verifies it, and returns the lexicon document.
// Errors wrap ErrNotFound, ErrInvalid or ErrFailed.
func (r *Resolver) Resolve(ctx context.Context, nsid syntax.NSID) (*Schema, error) {
	did, err := r.web.ResolveNSID(ctx, nsid)
	switch {
	case errors.Is(err, outbound.ErrNSIDNotFound):
		return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrFailed, err)
	}
	doc, err := r.dids.ResolveDID(ctx, did)
	switch {
	case errors.Is(err, identity.ErrDIDNotFound):
		return nil, fmt.Errorf("%w: %s: %w", ErrNotFound, did, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %s: %w", ErrFailed, did, err)
	}
	ident := identity.ParseIdentity(doc)
	key, err := ident.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: %s has no atproto signing key: %w", ErrNotFound, did, err)
	}
	pds := ident.PDSEndpoint()
	if pds == "" {
		return nil, fmt.Errorf("%w: %s names no PDS", ErrNotFound, did)
	}
	proof, err := r.fetchProof(ctx, pds, did, nsid)
	if err != nil {
		return nil, err
	}
	raw, recordCID, err := VerifyRecordProof(ctx, proof, did, key, SchemaCollection, nsid.String())
	if errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	document, err := lexiconDocument(raw, nsid)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return &Schema{
		NSID:     nsid,
		URI:      syntax.ATURI("at://" + did.String() + "/" + SchemaCollection + "/" + nsid.String()),
		CID:      recordCID.String(),
		Document: document,
	}, nil
}

// fetchProof asks the PDS at endpoint for the record's proof CAR.
func (r *Resolver) fetchProof(ctx context.Context, endpoint string, did syntax.DID, nsid syntax.NSID) ([]byte, error) {
	q := url.Values{"did": {did.String()}, "collection": {SchemaCollection}, "rkey": {nsid.String()}}
	u := strings.TrimRight(endpoint, "/") + "/xrpc/com.atproto.sync.getRecord?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: PDS endpoint %q: %w", ErrNotFound, endpoint, err)
	}
	req.Header.Set("Accept", "application/vnd.ipld.car")
	resp, err := r.web.Do(req, outbound.WithMaxBytes(MaxProofBytes), outbound.WithRedirects(0))
	if err != nil {
		if outbound.Refused(err) {
			return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
		}
		return nil, fmt.Errorf("%w: fetching the proof: %w", ErrFailed, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the proof: %w", ErrFailed, err)
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return body, nil
	case resp.StatusCode == http.StatusNotFound, resp.StatusCode == http.StatusBadRequest && isNotFoundError(body):
		return nil, fmt.Errorf("%w: the PDS has no %s/%s (HTTP %d)", ErrNotFound, SchemaCollection, nsid, resp.StatusCode)
	}
	return nil, fmt.Errorf("%w: the PDS answered HTTP %d", ErrFailed, resp.StatusCode)
}

// isNotFoundError reports whether an XRPC error body names a missing
// record or repository.
func isNotFoundError(body []byte) bool {
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return false
	}
	switch e.Error {
	case "RecordNotFound", "RepoNotFound", "RepoDeactivated", "RepoTakendown", "RepoSuspended":
		return true
	}
	return false
}

// lexiconDocument turns the record's DAG-CBOR into JSON and checks that
// it is a lexicon document (version 1) for nsid.
func lexiconDocument(raw []byte, nsid syntax.NSID) (json.RawMessage, error) {
	data, err := atdata.UnmarshalCBOR(raw)
	if err != nil {
		return nil, fmt.Errorf("the record is not valid atproto data: %w", err)
	}
	if t, _ := data["$type"].(string); t != SchemaCollection {
		return nil, fmt.Errorf("the record's $type is %q, not %s", t, SchemaCollection)
	}
	if v, ok := data["lexicon"].(int64); !ok || v != 1 {
		return nil, fmt.Errorf("the record is not a version 1 lexicon")
	}
	if id, _ := data["id"].(string); id != nsid.String() {
		return nil, fmt.Errorf("the record's id is %q, not %s", id, nsid)
	}
	b, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("the record cannot be written as JSON: %w", err)
	}
	return b, nil
}

// ResolveLexicon is Resolve's document alone (package oauth's
// LexiconResolver).
func (r *Resolver) ResolveLexicon(ctx context.Context, nsid syntax.NSID) (json.RawMessage, error) {
	s, err := r.Resolve(ctx, nsid)
	if err != nil {
		return nil, err
	}
	return s.Document, nil
}
