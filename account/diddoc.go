package account

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/plc"
)

// An account's DID document, wherever it lives: a did:plc's in the PLC
// directory (its last operation, read through package plc), a did:web's at
// the user's own https://<host>/.well-known/did.json (read through a
// DocResolver the caller passes: the server's guarded outbound client).

// DocResolver fetches the DID documents of did:webs.
type DocResolver interface {
	// Refresh returns did's document as it stands now, not from a cache.
	Refresh(ctx context.Context, did syntax.DID) (*identity.DIDDocument, error)
}

// DID document errors. The pds package maps each to an XRPC error.
var (
	// ErrDIDNotResolved means a did:web's document could not be fetched
	// or read (no such host, a refused address, an error answer, a
	// document that is not one). Nothing was changed.
	ErrDIDNotResolved = errors.New("could not resolve DID")
	// ErrNotPLC means a PLC operation was asked for an account whose DID
	// is not a did:plc: a did:web's document is its owner's file.
	ErrNotPLC = errors.New("not a did:plc")
)

// hosting is what a DID document says about the account's hosting.
type hosting struct {
	// endpoint is the atproto_pds service's URL ("" if none, or, in a
	// did:web document, not of type AtprotoPersonalDataServer).
	endpoint string
	// signingKey is the atproto verification method as a did:key ("" if
	// none, or unreadable).
	signingKey string
	// rotationKeys are a did:plc's rotation keys (nil for a did:web).
	rotationKeys []string
	// handle is the first handle in alsoKnownAs ("" if none).
	handle syntax.Handle
}

// supportedDID parses raw as a DID this server can host: a did:plc, or a
// did:web atproto resolves (package outbound's WebDocURL: a hostname, or
// localhost with a port for development).
func supportedDID(raw string) (syntax.DID, error) {
	did, err := syntax.ParseDID(raw)
	if err == nil && (did.Method() == "plc" || did.Method() == "web") {
		return did, nil
	}
	return "", ruleErr(ErrUnsupportedDID, "only a did:plc or a did:web can be brought here, not %.100q", raw)
}

// currentHosting reads did's DID document as it stands now: a did:plc's
// last operation from the PLC directory (a tombstone is
// ErrIncompatibleDIDDoc, a directory failure plc.ErrDirectory), a
// did:web's document through docs (ErrDIDNotResolved when it cannot be
// fetched; without docs, ErrUnsupportedDID).
func (s *Service) currentHosting(ctx context.Context, did syntax.DID, docs DocResolver) (*hosting, error) {
	switch did.Method() {
	case "plc":
		op, _, err := s.plc.Last(ctx, did)
		if errors.Is(err, plc.ErrTombstoned) {
			return nil, ruleErr(ErrIncompatibleDIDDoc, "%s is tombstoned in the PLC directory", did)
		}
		if err != nil {
			return nil, err
		}
		// As the reference PDS reads a did:plc's data: the atproto_pds
		// entry's endpoint, whatever its type.
		return &hosting{
			endpoint:     op.Services[plc.ServiceID].Endpoint,
			signingKey:   op.VerificationMethods[plc.VerificationMethod],
			rotationKeys: slices.Clone(op.RotationKeys),
			handle:       firstHandle(op.AlsoKnownAs),
		}, nil
	case "web":
		if docs == nil {
			return nil, ruleErr(ErrUnsupportedDID, "%s: this server resolves no did:web here", did)
		}
		doc, err := docs.Refresh(ctx, did)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			// The cause (a refused address, a timeout) goes to the log
			// only: the answer is the same whatever lies behind the name.
			s.log.Debug("did:web document not fetched", "did", did, "error", err)
			return nil, ruleErr(ErrDIDNotResolved, "Could not resolve DID: the document of %s could not be fetched from its /.well-known/did.json", did)
		}
		return webHosting(doc), nil
	}
	return nil, ruleErr(ErrUnsupportedDID, "%.100s is neither a did:plc nor a did:web", did)
}

// webHosting reads a did:web document as the reference implementation
// does: the #atproto_pds service of type AtprotoPersonalDataServer (given
// as "#atproto_pds" or "<did>#atproto_pds"; the first such entry), the
// #atproto key, the first at:// handle.
func webHosting(doc *identity.DIDDocument) *hosting {
	h := &hosting{}
	for _, svc := range doc.Service {
		if svc.ID != "#"+plc.ServiceID && svc.ID != doc.DID.String()+"#"+plc.ServiceID {
			continue
		}
		if svc.Type == plc.ServiceType {
			h.endpoint = svc.ServiceEndpoint
		}
		break
	}
	ident := identity.ParseIdentity(doc)
	if pub, err := ident.PublicKey(); err == nil {
		h.signingKey = pub.DIDKey()
	}
	h.handle = firstHandle(doc.AlsoKnownAs)
	return h
}

// firstHandle is the first at:// entry of alsoKnownAs that is a handle,
// lower case ("" if none).
func firstHandle(aka []string) syntax.Handle {
	for _, u := range aka {
		if raw, ok := strings.CutPrefix(u, "at://"); ok {
			if h, err := syntax.ParseHandle(raw); err == nil {
				return h.Normalize()
			}
			return ""
		}
	}
	return ""
}

// CheckDIDDocument checks that did's current DID document makes this
// server the account's PDS, as the reference PDS checks before
// activateAccount: the atproto_pds service at this server's URL, the
// account's signing key as the atproto verification method and, for a
// did:plc, this server's rotation key among the rotation keys. A did:plc
// document is its last PLC operation; a did:web's is fetched now through
// docs. A mismatch is ErrIncompatibleDIDDoc saying what differs; a did:web
// document that cannot be fetched is ErrDIDNotResolved; a PLC directory
// failure is plc.ErrDirectory.
func (s *Service) CheckDIDDocument(ctx context.Context, did syntax.DID, docs DocResolver) error {
	h, err := s.currentHosting(ctx, did, docs)
	if err != nil {
		return err
	}
	pub, err := s.PublicKey(ctx, did)
	if err != nil {
		return err
	}
	switch {
	case h.rotationKeys != nil && !slices.Contains(h.rotationKeys, s.plc.RotationKey()):
		return ruleErr(ErrIncompatibleDIDDoc, "Server rotation key not included in PLC DID data: this server's rotation key is not among the rotation keys of %s", did)
	case h.endpoint != s.cfg.PublicURL:
		return ruleErr(ErrIncompatibleDIDDoc, "DID document atproto_pds service endpoint does not match PDS public url: it is %.200q, not this server (%s)", h.endpoint, s.cfg.PublicURL)
	case h.signingKey != pub.DIDKey():
		return ruleErr(ErrIncompatibleDIDDoc, "DID document verification method does not match expected signing key: the atproto key must be %s", pub.DIDKey())
	}
	return nil
}

// requirePLC refuses a PLC operation for a DID that is not a did:plc.
func requirePLC(did syntax.DID) error {
	if did.Method() == "plc" {
		return nil
	}
	return ruleErr(ErrNotPLC, "%s is a did:%s, not a did:plc: it has no PLC operations; its document is changed where it is served "+
		"(for a did:web, https://<host>/.well-known/did.json: point #atproto_pds and #atproto at the new server, see getRecommendedDidCredentials)", did, did.Method())
}
