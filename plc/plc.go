package plc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
)

// Errors.
var (
	// ErrDirectory means the PLC directory refused an operation or could
	// not be reached. Nothing about the identity changed.
	ErrDirectory = errors.New("plc directory request failed")
	// ErrNotControlled means the DID's current rotation keys do not include
	// this server's: it cannot update the identity.
	ErrNotControlled = errors.New("this server's rotation key cannot update the DID")
	// ErrRejected means the directory answered a submitted operation with
	// a 4xx: the operation itself is wrong (a bad signature, a stale prev,
	// a malformed field). It always comes with ErrDirectory.
	ErrRejected = errors.New("plc directory rejected the operation")
	// ErrTombstoned means the DID has been deactivated for good.
	ErrTombstoned = errors.New("the DID is tombstoned")
)

// ServiceID and ServiceType name the PDS entry of a DID document.
const (
	ServiceID   = "atproto_pds"
	ServiceType = "AtprotoPersonalDataServer"
	// VerificationMethod is the name of the repository signing key.
	VerificationMethod = "atproto"
)

// DefaultTimeout bounds one request to the directory.
const DefaultTimeout = 15 * time.Second

// Client builds, signs and submits PLC operations with the server's
// rotation key.
type Client struct {
	dir         didplc.Client
	url         string
	rotationKey atcrypto.PrivateKey
	rotationDID string
}

// NewClient returns a client of the directory at url signing with
// rotationKey. httpClient may be nil (a client with DefaultTimeout).
func NewClient(url string, rotationKey atcrypto.PrivateKey, httpClient *http.Client) (*Client, error) {
	pub, err := rotationKey.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("plc rotation key: %w", err)
	}
	c := &Client{url: url, rotationKey: rotationKey, rotationDID: pub.DIDKey()}
	c.dir.DirectoryURL = url
	c.dir.UserAgent = "bulwark-pds"
	if httpClient != nil {
		c.dir.HTTPClient = *httpClient
	} else {
		c.dir.HTTPClient = http.Client{Timeout: DefaultTimeout}
	}
	return c, nil
}

// RotationKey is the server rotation key as a did:key.
func (c *Client) RotationKey() string { return c.rotationDID }

// Identity is what a DID document says about an atproto account.
type Identity struct {
	Handle      syntax.Handle
	SigningKey  atcrypto.PublicKey
	PDSEndpoint string
	// RecoveryKey, when set, is a rotation key of the account holder's
	// own (a did:key), put ahead of the server's in the genesis
	// operation: it can override the server's operations for 72 hours.
	RecoveryKey string
}

// Genesis builds and signs a genesis operation for a new account. The DID
// follows from the signed operation; nothing is sent. An http:// endpoint
// for a public directory is refused (ErrInsecureEndpoint, wrapped in
// ErrDirectory) before anything is signed.
func (c *Client) Genesis(id Identity) (syntax.DID, *didplc.RegularOp, error) {
	if err := CheckEndpoint(c.url, id.PDSEndpoint); err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrDirectory, err)
	}
	op := c.regularOp(id, nil)
	op.RotationKeys = []string{c.rotationDID}
	if id.RecoveryKey != "" && id.RecoveryKey != c.rotationDID {
		op.RotationKeys = []string{id.RecoveryKey, c.rotationDID}
	}
	if err := op.Sign(c.rotationKey); err != nil {
		return "", nil, fmt.Errorf("signing plc genesis: %w", err)
	}
	raw, err := op.DID()
	if err != nil {
		return "", nil, err
	}
	did, err := syntax.ParseDID(raw)
	if err != nil {
		return "", nil, err
	}
	return did, op, nil
}

func (c *Client) regularOp(id Identity, prev *string) *didplc.RegularOp {
	return &didplc.RegularOp{
		Type:                "plc_operation",
		VerificationMethods: map[string]string{VerificationMethod: id.SigningKey.DIDKey()},
		AlsoKnownAs:         []string{"at://" + id.Handle.String()},
		Services: map[string]didplc.OpService{
			ServiceID: {Type: ServiceType, Endpoint: id.PDSEndpoint},
		},
		Prev: prev,
	}
}

// Submit sends a signed operation for did to the directory. An operation
// that would publish an http:// PDS endpoint in a public directory is
// refused (ErrInsecureEndpoint, wrapped in ErrDirectory) without sending. A
// 4xx answer is ErrRejected (with the directory's message); any failure is
// ErrDirectory.
func (c *Client) Submit(ctx context.Context, did syntax.DID, op didplc.Operation) error {
	if reg, ok := op.(*didplc.RegularOp); ok {
		if svc, ok := reg.Services[ServiceID]; ok {
			if err := CheckEndpoint(c.url, svc.Endpoint); err != nil {
				return fmt.Errorf("%w: %w", ErrDirectory, err)
			}
		}
	}
	return c.post(ctx, did, op)
}

// UpdateHandle changes the handle in did's document, keeping everything
// else, with an operation signed by the server's rotation key.
func (c *Client) UpdateHandle(ctx context.Context, did syntax.DID, handle syntax.Handle) error {
	return c.update(ctx, did, func(op *didplc.RegularOp) {
		aka := []string{"at://" + handle.String()}
		for _, a := range op.AlsoKnownAs {
			if len(a) < 5 || a[:5] != "at://" {
				aka = append(aka, a)
			}
		}
		op.AlsoKnownAs = aka
	})
}

// update applies change to the document's last operation and submits the
// result as the next operation.
func (c *Client) update(ctx context.Context, did syntax.DID, change func(*didplc.RegularOp)) error {
	next, err := c.signNext(ctx, did, change)
	if err != nil {
		return err
	}
	return c.Submit(ctx, did, next)
}

// Tombstone deactivates did in the directory for good. It is used to clean
// up a DID whose account could not be stored after its genesis was
// submitted.
func (c *Client) Tombstone(ctx context.Context, did syntax.DID, genesis didplc.Operation) error {
	op := &didplc.TombstoneOp{Type: "plc_tombstone", Prev: genesis.CID().String()}
	if err := op.Sign(c.rotationKey); err != nil {
		return err
	}
	return c.Submit(ctx, did, op)
}

// Resolve fetches did's document from the directory.
func (c *Client) Resolve(ctx context.Context, did syntax.DID) (*didplc.Doc, error) {
	doc, err := c.dir.Resolve(ctx, did.String())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDirectory, err)
	}
	return doc, nil
}
