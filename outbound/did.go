package outbound

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Defaults of a zero DirectoryConfig, and DID document bounds.
const (
	// DefaultPLCURL is the public PLC directory.
	DefaultPLCURL = "https://plc.directory"
	// DefaultPLCTimeout bounds one request to the PLC directory.
	DefaultPLCTimeout = 10 * time.Second
	// DefaultCacheSize is how many DID documents, and separately how many
	// handles, a Directory remembers.
	DefaultCacheSize = 10_000
	// DefaultCacheTTL is how long a resolved DID document or handle is
	// remembered.
	DefaultCacheTTL = time.Hour
	// DefaultNotFoundTTL is how long "not found" is remembered.
	DefaultNotFoundTTL = 2 * time.Minute
	// MaxDIDDocBytes bounds a DID document.
	MaxDIDDocBytes = 128 << 10
)

// DID resolution errors. They are indigo's identity sentinels, so code
// written against indigo's directory keeps working.
var (
	// ErrDIDNotFound means the DID does not exist or cannot be resolved
	// here: the directory or did:web host answered 404 or 410, the did:web
	// host does not resolve, the method is not did:plc or did:web, or the
	// did:web host is one the guard refused (then Refused(err) holds too).
	ErrDIDNotFound = identity.ErrDIDNotFound
	// ErrDIDResolutionFailed means resolution failed (network error,
	// timeout, server error, an invalid or oversized document).
	ErrDIDResolutionFailed = identity.ErrDIDResolutionFailed
)

// DirectoryConfig tunes a Directory. The zero value resolves did:plc at
// DefaultPLCURL.
type DirectoryConfig struct {
	// PLCURL is the PLC directory did:plc documents come from (scheme,
	// host, optional port; no trailing slash). It is operator
	// configuration, so requests to it do not pass the guard (a
	// development PLC may listen on 127.0.0.1). Empty: DefaultPLCURL.
	PLCURL string
	// PLCClient makes the requests to PLCURL. Nil: a client with
	// DefaultPLCTimeout that follows no redirects, on net/http's default
	// transport (so HTTP_PROXY applies, as it does to the PLC client that
	// submits operations).
	PLCClient *http.Client
	// CacheSize bounds the cached DID documents, and separately the cached
	// handles. Zero: DefaultCacheSize.
	CacheSize int
	// CacheTTL is how long answers are remembered. Zero: DefaultCacheTTL.
	CacheTTL time.Duration
	// NotFoundTTL is how long "not found" is remembered. Zero:
	// DefaultNotFoundTTL.
	NotFoundTTL time.Duration
	// SkipHandleVerification makes LookupDID leave Identity.Handle as
	// handle.invalid instead of resolving the declared handle: for callers
	// that need only keys and endpoints, such as service-auth validation.
	SkipHandleVerification bool
	// UserAgent is sent to the PLC directory. Empty: DefaultUserAgent.
	UserAgent string
	// Logger: nil is slog.Default().
	Logger *slog.Logger
}

// Directory resolves DIDs and handles with a cache: did:plc through the
// configured PLC directory, did:web and handles through the guarded
// Client. It implements indigo's identity.Directory, so it can be the Dir
// of auth.ServiceAuthValidator. Returned documents and identities are
// shared with the cache: treat them as read-only.
type Directory struct {
	cfg     DirectoryConfig
	web     *Client
	plc     *http.Client
	docs    *ttlCache[syntax.DID, *identity.DIDDocument]
	handles *ttlCache[syntax.Handle, syntax.DID]
	log     *slog.Logger
}

var _ identity.Directory = (*Directory)(nil)

// NewDirectory returns a directory for cfg that fetches did:web documents
// and handles through web (nil: New(Config{})).
func NewDirectory(cfg DirectoryConfig, web *Client) *Directory {
	if cfg.PLCURL == "" {
		cfg.PLCURL = DefaultPLCURL
	}
	cfg.PLCURL = strings.TrimRight(cfg.PLCURL, "/")
	if cfg.PLCClient == nil {
		cfg.PLCClient = &http.Client{
			Timeout:       DefaultPLCTimeout,
			CheckRedirect: checkRedirect(0),
		}
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.NotFoundTTL <= 0 {
		cfg.NotFoundTTL = DefaultNotFoundTTL
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = DefaultUserAgent
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if web == nil {
		web = New(Config{Logger: cfg.Logger})
	}
	return &Directory{
		cfg:     cfg,
		web:     web,
		plc:     cfg.PLCClient,
		docs:    newTTLCache[syntax.DID, *identity.DIDDocument](cfg.CacheSize, cfg.CacheTTL, cfg.NotFoundTTL, ErrDIDNotFound),
		handles: newTTLCache[syntax.Handle, syntax.DID](cfg.CacheSize, cfg.CacheTTL, cfg.NotFoundTTL, ErrHandleNotFound),
		log:     cfg.Logger.With("component", "directory"),
	}
}

// ResolveDID returns did's current DID document (cached).
func (d *Directory) ResolveDID(ctx context.Context, did syntax.DID) (*identity.DIDDocument, error) {
	return d.docs.get(ctx, did, func(ctx context.Context) (*identity.DIDDocument, error) {
		return d.fetchDID(ctx, did)
	})
}

// ResolveHandle returns the DID handle h claims (cached), as
// Client.ResolveHandle finds it.
func (d *Directory) ResolveHandle(ctx context.Context, h syntax.Handle) (syntax.DID, error) {
	h = h.Normalize()
	return d.handles.get(ctx, h, func(ctx context.Context) (syntax.DID, error) {
		return d.web.ResolveHandle(ctx, h)
	})
}

// LookupDID returns did's identity. Its Handle is the declared handle when
// that resolves back to did, else handle.invalid (always handle.invalid
// with SkipHandleVerification).
func (d *Directory) LookupDID(ctx context.Context, did syntax.DID) (*identity.Identity, error) {
	doc, err := d.ResolveDID(ctx, did)
	if err != nil {
		return nil, err
	}
	ident := identity.ParseIdentity(doc)
	if d.cfg.SkipHandleVerification {
		return &ident, nil
	}
	declared, err := ident.DeclaredHandle()
	if err != nil {
		return &ident, nil
	}
	resolved, err := d.ResolveHandle(ctx, declared)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if err == nil && resolved == did {
		ident.Handle = declared
	}
	return &ident, nil
}

// LookupHandle resolves h and returns the identity of its DID, provided
// the DID document declares h back (else identity.ErrHandleMismatch).
func (d *Directory) LookupHandle(ctx context.Context, h syntax.Handle) (*identity.Identity, error) {
	h = h.Normalize()
	did, err := d.ResolveHandle(ctx, h)
	if err != nil {
		return nil, err
	}
	doc, err := d.ResolveDID(ctx, did)
	if err != nil {
		return nil, err
	}
	ident := identity.ParseIdentity(doc)
	declared, err := ident.DeclaredHandle()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", identity.ErrHandleMismatch, h, err)
	}
	if declared != h {
		return nil, fmt.Errorf("%w: %s declares %s, not %s", identity.ErrHandleMismatch, did, declared, h)
	}
	ident.Handle = h
	return &ident, nil
}

// Lookup is LookupHandle or LookupDID, as atid is.
func (d *Directory) Lookup(ctx context.Context, atid syntax.AtIdentifier) (*identity.Identity, error) {
	if h, err := atid.AsHandle(); err == nil {
		return d.LookupHandle(ctx, h)
	}
	if did, err := atid.AsDID(); err == nil {
		return d.LookupDID(ctx, did)
	}
	return nil, fmt.Errorf("at-identifier %q is neither a handle nor a DID", atid)
}

// Purge forgets what the cache holds for atid (a DID's document, or a
// handle's DID).
func (d *Directory) Purge(_ context.Context, atid syntax.AtIdentifier) error {
	if h, err := atid.AsHandle(); err == nil {
		d.handles.purge(h.Normalize())
	}
	if did, err := atid.AsDID(); err == nil {
		d.docs.purge(did)
	}
	return nil
}

// Refresh fetches did's document now, whatever the cache holds, and
// caches the answer: for a check that must see the document as it stands
// (a did:web the user has just edited), and so that later lookups see it
// too.
func (d *Directory) Refresh(ctx context.Context, did syntax.DID) (*identity.DIDDocument, error) {
	d.docs.purge(did)
	return d.ResolveDID(ctx, did)
}

func (d *Directory) fetchDID(ctx context.Context, did syntax.DID) (*identity.DIDDocument, error) {
	var body []byte
	var err error
	switch did.Method() {
	case "plc":
		body, err = d.fetchPLC(ctx, did)
	case "web":
		body, err = d.fetchWeb(ctx, did)
	default:
		return nil, fmt.Errorf("%w: unsupported DID method %q", ErrDIDNotFound, did.Method())
	}
	if err != nil {
		d.log.DebugContext(ctx, "DID not resolved", "did", did, "err", err)
		return nil, err
	}
	var doc identity.DIDDocument
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("%w: %s: parsing DID document: %w", ErrDIDResolutionFailed, did, err)
	}
	if doc.DID != did {
		return nil, fmt.Errorf("%w: the document for %s has id %q", ErrDIDResolutionFailed, did, doc.DID)
	}
	return &doc, nil
}

// fetchPLC asks the PLC directory, bypassing the guard: PLCURL is the
// operator's choice, and did:plc identifiers are checked first so a DID
// cannot add a path to it.
func (d *Directory) fetchPLC(ctx context.Context, did syntax.DID) ([]byte, error) {
	if !validPLCIdentifier(did.Identifier()) {
		return nil, fmt.Errorf("%w: %s is not a valid did:plc", ErrDIDNotFound, did)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.cfg.PLCURL+"/"+did.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDIDResolutionFailed, err)
	}
	req.Header.Set("User-Agent", d.cfg.UserAgent)
	req.Header.Set("Accept", "application/did+ld+json, application/json")
	resp, err := d.plc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: PLC directory: %w", ErrDIDResolutionFailed, err)
	}
	defer resp.Body.Close()
	return readDIDDoc(resp, io.LimitReader(resp.Body, MaxDIDDocBytes+1), "PLC directory")
}

// validPLCIdentifier: did:plc identifiers are 24 characters of base32
// (lowercase, RFC 4648 alphabet).
func validPLCIdentifier(id string) bool {
	if len(id) != 24 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// fetchWeb fetches did's /.well-known/did.json through the guard,
// following no redirects (WebDocURL says where).
func (d *Directory) fetchWeb(ctx context.Context, did syntax.DID) ([]byte, error) {
	u, err := WebDocURL(did)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDIDResolutionFailed, err)
	}
	req.Header.Set("Accept", "application/did+ld+json, application/json")
	resp, err := d.web.Do(req, WithMaxBytes(MaxDIDDocBytes), WithRedirects(0))
	if err != nil {
		var dnsErr *net.DNSError
		if Refused(err) || (errors.As(err, &dnsErr) && dnsErr.IsNotFound) {
			return nil, fmt.Errorf("%w: did:web: %w", ErrDIDNotFound, err)
		}
		return nil, fmt.Errorf("%w: did:web: %w", ErrDIDResolutionFailed, err)
	}
	defer resp.Body.Close()
	return readDIDDoc(resp, resp.Body, "did:web host")
}

// WebDocURL is where a did:web's document lives, as atproto resolves it:
// https://<host>/.well-known/did.json for a hostname did:web (no port, no
// path, a top-level domain handles may use), and, for development,
// http://localhost[:<port>]/.well-known/did.json for did:web:localhost
// with an optional port (written %3A), as the reference implementation
// does. Any other did:web is ErrDIDNotFound. The URL still goes through
// the guard: localhost only where the operator allows loopback.
func WebDocURL(did syntax.DID) (string, error) {
	notWeb := fmt.Errorf("%w: %.200s is not a hostname did:web", ErrDIDNotFound, did)
	if did.Method() != "web" {
		return "", notWeb
	}
	id := strings.ReplaceAll(did.Identifier(), "%3a", "%3A")
	if host, port, ok := strings.Cut(id, "%3A"); ok || strings.EqualFold(id, "localhost") {
		if !strings.EqualFold(host, "localhost") || (ok && !validPort(port)) {
			return "", notWeb
		}
		u := "http://localhost"
		if ok {
			u += ":" + port
		}
		return u + "/.well-known/did.json", nil
	}
	host, err := syntax.ParseHandle(id)
	if err != nil || !host.AllowedTLD() {
		return "", notWeb
	}
	return "https://" + host.Normalize().String() + "/.well-known/did.json", nil
}

// validPort: a decimal TCP port, 1–65535, without leading zeros.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535 && strconv.Itoa(n) == p
}

// readDIDDoc reads a document response of at most MaxDIDDocBytes.
func readDIDDoc(resp *http.Response, body io.Reader, who string) ([]byte, error) {
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, fmt.Errorf("%w: %s answered HTTP %d", ErrDIDNotFound, who, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%w: %s answered HTTP %d", ErrDIDResolutionFailed, who, resp.StatusCode)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, fmt.Errorf("%w: reading from %s: %w", ErrDIDResolutionFailed, who, err)
	}
	if len(b) > MaxDIDDocBytes {
		return nil, fmt.Errorf("%w: %w: %s sent a document over %d bytes", ErrDIDResolutionFailed, ErrResponseTooLarge, who, MaxDIDDocBytes)
	}
	return b, nil
}

// ServiceEndpoint returns the endpoint of doc's service id, which may be
// given as "atproto_pds" or "#atproto_pds". The document's entry may name
// it relatively ("#atproto_pds") or absolutely ("<doc's DID>#atproto_pds");
// an entry of another DID does not match. ok is false when there is no
// such service or its endpoint is not an absolute http(s) URL.
func ServiceEndpoint(doc *identity.DIDDocument, id string) (endpoint string, ok bool) {
	if doc == nil || id == "" {
		return "", false
	}
	frag := "#" + strings.TrimPrefix(id, "#")
	for _, s := range doc.Service {
		if s.ID != frag && s.ID != doc.DID.String()+frag {
			continue
		}
		// The first entry with the id decides, as in the reference
		// implementation.
		u, err := url.Parse(s.ServiceEndpoint)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return "", false
		}
		return s.ServiceEndpoint, true
	}
	return "", false
}
