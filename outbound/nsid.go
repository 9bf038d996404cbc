package outbound

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// LexiconDNSTimeout bounds the _lexicon TXT lookup.
const LexiconDNSTimeout = 3 * time.Second

// Lexicon authority errors. They are indigo's identity sentinels.
var (
	// ErrNSIDNotFound means no DID publishes the NSID's lexicons: no
	// _lexicon TXT record with a DID, or a reserved top-level domain.
	ErrNSIDNotFound = identity.ErrNSIDNotFound
	// ErrNSIDResolutionFailed means the lookup failed (DNS error, timeout,
	// two different DIDs): retrying later may succeed.
	ErrNSIDResolutionFailed = identity.ErrNSIDResolutionFailed
)

// ResolveNSID finds the DID whose repository publishes nsid's lexicon, as
// the lexicon spec says: the DNS TXT record _lexicon.<authority>, where
// the authority is the NSID without its name, reversed (app.bsky.feed.post:
// _lexicon.feed.bsky.app), holding "did=<DID>" (exactly one distinct DID).
// Resolution is not hierarchical: no parent or child name is tried. The
// lookup goes through the client's resolver (Config.Resolver).
func (c *Client) ResolveNSID(ctx context.Context, nsid syntax.NSID) (syntax.DID, error) {
	authority, err := syntax.ParseHandle(nsid.Authority())
	if err != nil || !authority.AllowedTLD() {
		return "", fmt.Errorf("%w: %s has no usable authority domain", ErrNSIDNotFound, nsid)
	}
	ctx, cancel := context.WithTimeout(ctx, LexiconDNSTimeout)
	defer cancel()
	name := "_lexicon." + authority.Normalize().String()
	records, err := c.resolver.LookupTXT(ctx, name)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return "", fmt.Errorf("%w: no %s TXT record", ErrNSIDNotFound, name)
		}
		return "", fmt.Errorf("%w: %s TXT lookup: %w", ErrNSIDResolutionFailed, name, err)
	}
	return pickTXTDID(records, name, ErrNSIDNotFound, ErrNSIDResolutionFailed)
}

// pickTXTDID picks the DID out of the TXT records at name: records that
// do not start with "did=", or whose value is not a DID, are ignored; two
// different DIDs are failed, none is notFound.
func pickTXTDID(records []string, name string, notFound, failed error) (syntax.DID, error) {
	var found syntax.DID
	for _, r := range records {
		v, ok := strings.CutPrefix(r, "did=")
		if !ok {
			continue
		}
		did, err := syntax.ParseDID(strings.TrimSpace(v))
		if err != nil {
			continue
		}
		if found != "" && did != found {
			return "", fmt.Errorf("%w: %s TXT records name both %s and %s", failed, name, found, did)
		}
		found = did
	}
	if found == "" {
		return "", fmt.Errorf("%w: no did= record in %s TXT", notFound, name)
	}
	return found, nil
}
