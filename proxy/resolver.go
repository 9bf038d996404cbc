package proxy

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

// Resolver finds a service's endpoint from a DID and a service id.
type Resolver interface {
	// ResolveService returns the base URL (scheme://host[:port]) of the
	// service with id serviceID (without '#') in did's DID document.
	// Errors wrap ErrUnknownDID, ErrUnknownService or ErrResolution.
	ResolveService(ctx context.Context, did syntax.DID, serviceID string) (string, error)
}

// DocumentSource looks up DID documents: indigo's identity.Resolver
// (identity.BaseDirectory, identity.MockDirectory) has this method. A
// missing DID is reported as identity.ErrDIDNotFound.
type DocumentSource interface {
	ResolveDID(ctx context.Context, did syntax.DID) (*identity.DIDDocument, error)
}

// DirectorySource adapts an identity.Directory (which returns parsed
// identities, perhaps from its own cache) to a DocumentSource.
type DirectorySource struct {
	Dir identity.Directory
}

// ResolveDID implements DocumentSource.
func (s DirectorySource) ResolveDID(ctx context.Context, did syntax.DID) (*identity.DIDDocument, error) {
	ident, err := s.Dir.LookupDID(ctx, did)
	if err != nil {
		return nil, err
	}
	doc := ident.DIDDocument()
	return &doc, nil
}

// Resolver cache defaults.
const (
	DefaultResolverTTL         = 5 * time.Minute
	DefaultResolverNegativeTTL = 30 * time.Second
	DefaultResolverSize        = 10_000
	// maxServicesPerDoc bounds what one cached document may hold.
	maxServicesPerDoc = 32
)

// ResolverConfig configures a DocResolver. The zero value works.
type ResolverConfig struct {
	// TTL is how long a resolved document's services are kept (default
	// DefaultResolverTTL).
	TTL time.Duration
	// NegativeTTL is how long "this DID does not exist" is kept (default
	// DefaultResolverNegativeTTL). Other failures are not cached.
	NegativeTTL time.Duration
	// Size bounds the number of cached DIDs (default DefaultResolverSize).
	Size int
	// AllowHTTP accepts http:// service endpoints (local development and
	// tests); by default only https:// endpoints are used.
	AllowHTTP bool
}

// DocResolver is a Resolver over a DocumentSource with an in-memory,
// size-bounded TTL cache. Concurrent lookups of one DID share one fetch.
type DocResolver struct {
	src   DocumentSource
	cfg   ResolverConfig
	cache *lru.Cache[syntax.DID, *docEntry]
	group singleflight.Group
	now   func() time.Time
}

// docEntry is what is cached for one DID: its services by fragment
// (endpoint "" = present but unusable), or that it does not exist.
type docEntry struct {
	services map[string]string
	notFound bool
	expires  time.Time
}

// NewDocResolver returns a caching Resolver over src.
func NewDocResolver(src DocumentSource, cfg ResolverConfig) *DocResolver {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultResolverTTL
	}
	if cfg.NegativeTTL <= 0 {
		cfg.NegativeTTL = DefaultResolverNegativeTTL
	}
	if cfg.Size <= 0 {
		cfg.Size = DefaultResolverSize
	}
	cache, err := lru.New[syntax.DID, *docEntry](cfg.Size)
	if err != nil {
		panic(err) // only for a non-positive size, excluded above
	}
	return &DocResolver{src: src, cfg: cfg, cache: cache, now: time.Now}
}

// ResolveService implements Resolver. It accepts service entries whose id
// is "#<serviceID>" or "<did>#<serviceID>".
func (r *DocResolver) ResolveService(ctx context.Context, did syntax.DID, serviceID string) (string, error) {
	e, err := r.entry(ctx, did)
	if err != nil {
		return "", err
	}
	if e.notFound {
		return "", newError(ErrUnknownDID, nil, "could not resolve proxy DID %s", did)
	}
	endpoint, ok := e.services[serviceID]
	if !ok {
		return "", newError(ErrUnknownService, nil, "DID %s has no service #%s", did, serviceID)
	}
	if endpoint == "" {
		return "", newError(ErrUnknownService, nil, "service #%s of %s has no usable endpoint", serviceID, did)
	}
	return endpoint, nil
}

// Purge forgets what is cached for did.
func (r *DocResolver) Purge(did syntax.DID) {
	r.cache.Remove(did)
}

func (r *DocResolver) entry(ctx context.Context, did syntax.DID) (*docEntry, error) {
	if e, ok := r.cache.Get(did); ok && r.now().Before(e.expires) {
		return e, nil
	}
	v, err, _ := r.group.Do(string(did), func() (any, error) {
		return r.fetch(ctx, did)
	})
	if err != nil {
		return nil, err
	}
	return v.(*docEntry), nil
}

func (r *DocResolver) fetch(ctx context.Context, did syntax.DID) (*docEntry, error) {
	doc, err := r.src.ResolveDID(ctx, did)
	switch {
	case errors.Is(err, identity.ErrDIDNotFound):
		e := &docEntry{notFound: true, expires: r.now().Add(r.cfg.NegativeTTL)}
		r.cache.Add(did, e)
		return e, nil
	case err != nil:
		return nil, newError(ErrResolution, err, "could not resolve proxy DID %s", did)
	case doc == nil || doc.DID != did:
		// A document for another DID is as good as none.
		return nil, newError(ErrUnknownDID, nil, "could not resolve proxy DID %s", did)
	}
	e := &docEntry{services: r.services(did, doc), expires: r.now().Add(r.cfg.TTL)}
	r.cache.Add(did, e)
	return e, nil
}

// services extracts the usable endpoints of doc, keyed by fragment; the
// first entry for a fragment wins, as in indigo's ParseIdentity.
func (r *DocResolver) services(did syntax.DID, doc *identity.DIDDocument) map[string]string {
	out := make(map[string]string, min(len(doc.Service), maxServicesPerDoc))
	for _, s := range doc.Service {
		if len(out) == maxServicesPerDoc {
			break
		}
		owner, frag, ok := strings.Cut(s.ID, "#")
		if !ok || frag == "" || (owner != "" && owner != string(did)) {
			continue
		}
		if _, dup := out[frag]; dup {
			continue
		}
		out[frag] = endpointOrigin(s.ServiceEndpoint, r.cfg.AllowHTTP)
	}
	return out
}

// endpointOrigin returns scheme://host[:port] of raw, or "" when raw is
// not an absolute https URL (http too when allowHTTP) without credentials.
// The path is dropped: requests go to <origin>/xrpc/<nsid>, as the
// reference PDS sends them.
func endpointOrigin(raw string, allowHTTP bool) string {
	if len(raw) > 2048 {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.Opaque != "" {
		return ""
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !allowHTTP {
			return ""
		}
	default:
		return ""
	}
	return u.Scheme + "://" + u.Host
}
