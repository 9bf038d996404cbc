package outbound

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Handle resolution bounds.
const (
	// HandleDNSTimeout bounds the _atproto TXT lookup.
	HandleDNSTimeout = 3 * time.Second
	// MaxWellKnownBytes bounds the body of /.well-known/atproto-did: a DID
	// and some whitespace.
	MaxWellKnownBytes = 512
	// MaxHandleRedirects is how many redirects the well-known fetch follows
	// (the handle spec allows "a reasonable number"); every hop is checked
	// like the first request.
	MaxHandleRedirects = 3
)

// Handle resolution errors. They are indigo's identity sentinels, so code
// written against indigo's directory keeps working.
var (
	// ErrHandleNotFound means neither method found a DID for the handle:
	// no TXT record and no well-known answer, a reserved TLD, or a
	// well-known host the guard refused (then errors.Is(err,
	// ErrForbiddenAddress) or Refused(err) holds as well). Reporting it as
	// the resolveHandle answer leaks nothing about refused addresses.
	ErrHandleNotFound = identity.ErrHandleNotFound
	// ErrHandleResolutionFailed means a lookup failed (DNS error, timeout,
	// server error, a body that is not a DID, more than one DID in TXT
	// records): retrying later may succeed.
	ErrHandleResolutionFailed = identity.ErrHandleResolutionFailed
)

// ResolveHandle finds the DID a handle claims, as the atproto handle spec
// says: the DNS TXT record _atproto.<handle> ("did=<DID>"; exactly one
// distinct valid DID), else https://<handle>/.well-known/atproto-did
// through the guard. It does not check that the DID's document names the
// handle back; Directory.LookupHandle does.
func (c *Client) ResolveHandle(ctx context.Context, h syntax.Handle) (syntax.DID, error) {
	h = h.Normalize()
	if h.IsInvalidHandle() || !h.AllowedTLD() {
		return "", fmt.Errorf("%w: %s has a reserved top-level domain", ErrHandleNotFound, h)
	}
	did, dnsErr := c.resolveHandleDNS(ctx, h)
	if dnsErr == nil {
		return did, nil
	}
	did, httpErr := c.resolveHandleWellKnown(ctx, h)
	if httpErr == nil {
		return did, nil
	}
	c.log.DebugContext(ctx, "outbound: handle not resolved", "handle", h, "dns", dnsErr, "https", httpErr)
	switch {
	case errors.Is(dnsErr, ErrHandleNotFound) && errors.Is(httpErr, ErrHandleNotFound):
		return "", fmt.Errorf("resolving %s: dns: %v; https: %w", h, dnsErr, httpErr)
	case errors.Is(httpErr, ErrHandleNotFound):
		return "", fmt.Errorf("resolving %s: https: %v; dns: %w", h, httpErr, dnsErr)
	}
	return "", fmt.Errorf("resolving %s: dns: %v; https: %w", h, dnsErr, httpErr)
}

func (c *Client) resolveHandleDNS(ctx context.Context, h syntax.Handle) (syntax.DID, error) {
	ctx, cancel := context.WithTimeout(ctx, HandleDNSTimeout)
	defer cancel()
	records, err := c.resolver.LookupTXT(ctx, "_atproto."+h.String())
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return "", fmt.Errorf("%w: no _atproto TXT record", ErrHandleNotFound)
		}
		return "", fmt.Errorf("%w: TXT lookup: %w", ErrHandleResolutionFailed, err)
	}
	return didFromTXT(records)
}

// didFromTXT picks the DID out of _atproto TXT records. Records that do
// not start with "did=", or whose value is not a DID, are ignored; two
// different DIDs fail the lookup, as the spec requires.
func didFromTXT(records []string) (syntax.DID, error) {
	return pickTXTDID(records, "_atproto", ErrHandleNotFound, ErrHandleResolutionFailed)
}

func (c *Client) resolveHandleWellKnown(ctx context.Context, h syntax.Handle) (syntax.DID, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+h.String()+"/.well-known/atproto-did", nil)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrHandleResolutionFailed, err)
	}
	resp, err := c.Do(req, WithMaxBytes(MaxWellKnownBytes), WithRedirects(MaxHandleRedirects))
	if err != nil {
		var dnsErr *net.DNSError
		if Refused(err) || (errors.As(err, &dnsErr) && dnsErr.IsNotFound) {
			return "", fmt.Errorf("%w: %w", ErrHandleNotFound, err)
		}
		return "", fmt.Errorf("%w: %w", ErrHandleResolutionFailed, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return "", fmt.Errorf("%w: well-known answered HTTP %d", ErrHandleNotFound, resp.StatusCode)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return "", fmt.Errorf("%w: well-known answered HTTP %d", ErrHandleResolutionFailed, resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("%w: reading well-known: %w", ErrHandleResolutionFailed, err)
	}
	did, err := syntax.ParseDID(strings.TrimSpace(string(body)))
	if err != nil {
		return "", fmt.Errorf("%w: well-known body is not a DID", ErrHandleResolutionFailed)
	}
	return did, nil
}
