package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/go-jose/go-jose/v4"
	"golang.org/x/sync/singleflight"

	"github.com/bulwark-pds/bulwark/oauth/dpop"
)

// Client metadata fetching limits.
const (
	// MaxClientIDLen bounds a client_id (it is stored and shown).
	MaxClientIDLen = 2048
	// MaxDocumentBytes bounds a client metadata or JWKS document.
	MaxDocumentBytes = 64 << 10
	// FetchTimeout bounds one document fetch.
	FetchTimeout = 10 * time.Second
	// DefaultClientCacheTTL is how long a fetched document is used. Short
	// enough that a confidential client's removed key stops working soon.
	DefaultClientCacheTTL = 10 * time.Minute
	// failureCacheTTL keeps a failed fetch from being retried at once.
	failureCacheTTL = 30 * time.Second
	// maxCachedClients bounds the cache.
	maxCachedClients = 10000
)

// client is a validated client.
type client struct {
	ID       string
	Metadata indigo.ClientMetadata
	// Localhost marks the http://localhost development form (virtual
	// metadata, public client).
	Localhost bool
	// Keys are a confidential client's assertion keys.
	Keys []jose.JSONWebKey
}

func (c *client) confidential() bool { return c.Metadata.TokenEndpointAuthMethod == "private_key_jwt" }

// name is what the consent page calls the client: the client_id unless the
// operator trusts it to name itself.
func (s *Server) clientName(c *client) string {
	if slices.Contains(s.cfg.TrustedClients, c.ID) && c.Metadata.ClientName != nil && *c.Metadata.ClientName != "" {
		return *c.Metadata.ClientName
	}
	if c.Localhost {
		return "a development app on this computer"
	}
	u, err := url.Parse(c.ID)
	if err != nil {
		return c.ID
	}
	return u.Host
}

type cacheEntry struct {
	client  *client
	err     error
	expires time.Time
}

type clientCache struct {
	cfg   *Config
	http  *http.Client
	mu    sync.Mutex
	items map[string]cacheEntry
	group singleflight.Group
}

func newClientCache(cfg *Config) *clientCache {
	hc := *cfg.HTTPClient
	// The profile wants a 200 from the client_id URL itself, not a redirect.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &clientCache{cfg: cfg, http: &hc, items: make(map[string]cacheEntry)}
}

func (cc *clientCache) ttl() time.Duration {
	if cc.cfg.ClientCacheTTL > 0 {
		return cc.cfg.ClientCacheTTL
	}
	return DefaultClientCacheTTL
}

// get returns the client for clientID, from the cache or freshly fetched.
// Errors are *Error values for the client (invalid_client).
func (cc *clientCache) get(ctx context.Context, clientID string) (*client, error) {
	now := cc.cfg.Now()
	cc.mu.Lock()
	e, ok := cc.items[clientID]
	cc.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.client, e.err
	}
	v, err, _ := cc.group.Do(clientID, func() (any, error) {
		// Fetch with a context of its own: one caller giving up must not
		// fail the others waiting on the same fetch.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FetchTimeout)
		defer cancel()
		c, err := cc.load(fctx, clientID)
		entry := cacheEntry{client: c, err: err, expires: cc.cfg.Now().Add(cc.ttl())}
		if err != nil {
			entry.expires = cc.cfg.Now().Add(failureCacheTTL)
		}
		cc.mu.Lock()
		if len(cc.items) >= maxCachedClients {
			for k, old := range cc.items {
				if !cc.cfg.Now().Before(old.expires) || len(cc.items) >= maxCachedClients {
					delete(cc.items, k)
				}
				if len(cc.items) < maxCachedClients/2 {
					break
				}
			}
		}
		cc.items[clientID] = entry
		cc.mu.Unlock()
		return c, err
	})
	if err != nil {
		return nil, err
	}
	return v.(*client), nil
}

func (cc *clientCache) load(ctx context.Context, clientID string) (*client, error) {
	if len(clientID) > MaxClientIDLen {
		return nil, invalidClient("client_id is longer than %d bytes", MaxClientIDLen)
	}
	if strings.HasPrefix(clientID, "http://") {
		if cc.cfg.DisableLocalhostClients {
			return nil, invalidClient("development (http://localhost) clients are not allowed on this server")
		}
		return localhostClient(clientID)
	}
	if err := checkClientIDURL(clientID, cc.cfg.AllowPrivateClientIDs); err != nil {
		return nil, err
	}
	var md indigo.ClientMetadata
	if err := cc.fetchJSON(ctx, clientID, &md); err != nil {
		return nil, invalidClient("client metadata: %v", err)
	}
	if err := md.Validate(clientID); err != nil {
		return nil, invalidClient("%v", err)
	}
	c := &client{ID: clientID, Metadata: md}
	if err := checkMetadata(c); err != nil {
		return nil, err
	}
	if c.confidential() {
		keys, err := cc.clientKeys(ctx, &md)
		if err != nil {
			return nil, err
		}
		c.Keys = keys
	}
	return c, nil
}

// checkClientIDURL applies the profile's rules to an https client_id.
func checkClientIDURL(clientID string, allowPrivate bool) error {
	u, err := url.Parse(clientID)
	if err != nil {
		return invalidClient("client_id is not a URL")
	}
	if u.Scheme != "https" || u.Host == "" || u.User != nil || u.Fragment != "" || u.Opaque != "" {
		return invalidClient("client_id must be an https URL without credentials or fragment")
	}
	if allowPrivate {
		return nil
	}
	if u.Port() != "" {
		return invalidClient("client_id must not carry a port")
	}
	host := strings.ToLower(u.Hostname())
	if net.ParseIP(host) != nil {
		return invalidClient("client_id must name a host, not an IP address")
	}
	if !strings.Contains(host, ".") || host == "localhost" || hasLocalSuffix(host) {
		return invalidClient("client_id must name a public host")
	}
	return nil
}

func hasLocalSuffix(host string) bool {
	for _, suffix := range []string{".localhost", ".local", ".internal", ".test", ".invalid", ".example", ".arpa", ".home", ".lan", ".corp"} {
		if strings.HasSuffix(host, suffix) {
			return true
		}
	}
	return false
}

// fetchJSON GETs an https document of at most MaxDocumentBytes that must
// answer exactly 200 with a JSON content type.
func (cc *clientCache) fetchJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := cc.http.Do(req)
	if err != nil {
		return fmt.Errorf("fetch failed: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch answered HTTP %d (want 200)", resp.StatusCode)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/json" {
		return fmt.Errorf("content type %q is not application/json", mt)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxDocumentBytes+1))
	if err != nil {
		return fmt.Errorf("reading document: %w", err)
	}
	if len(body) > MaxDocumentBytes {
		return fmt.Errorf("document is larger than %d bytes", MaxDocumentBytes)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("document is not valid JSON: %w", err)
	}
	return nil
}

// checkMetadata adds the profile's rules indigo's Validate leaves out.
func checkMetadata(c *client) error {
	md := &c.Metadata
	for _, g := range md.GrantTypes {
		if g != "authorization_code" && g != "refresh_token" {
			return invalidClient("unsupported grant type %q in client metadata", g)
		}
	}
	if c.confidential() {
		if md.TokenEndpointAuthSigningAlg != nil && *md.TokenEndpointAuthSigningAlg != "ES256" {
			return invalidClient("token_endpoint_auth_signing_alg must be ES256")
		}
		hasJWKS := md.JWKS != nil && len(md.JWKS.Keys) > 0
		if hasJWKS == (md.JWKSURI != nil) {
			return invalidClient("a confidential client needs exactly one of jwks and jwks_uri")
		}
		if md.JWKSURI != nil && !strings.HasPrefix(*md.JWKSURI, "https://") {
			return invalidClient("jwks_uri must be an https URL")
		}
	}
	native := md.ApplicationType != nil && *md.ApplicationType == "native"
	for _, ru := range md.RedirectURIs {
		if err := checkRedirectURI(c.ID, ru, native); err != nil {
			return err
		}
	}
	return nil
}

// checkRedirectURI applies the redirect rules for web and native clients.
func checkRedirectURI(clientID, raw string, native bool) error {
	u, err := url.Parse(raw)
	if err != nil || u.Fragment != "" {
		return invalidClient("redirect_uri %q is not a valid URL without fragment", raw)
	}
	switch {
	case u.Scheme == "https":
		if u.Host == "" {
			return invalidClient("redirect_uri %q has no host", raw)
		}
		return nil
	case u.Scheme == "http":
		if isLoopbackIP(u.Hostname()) {
			return nil
		}
		return invalidClient("redirect_uri %q must be https (or http on 127.0.0.1 / [::1])", raw)
	case native:
		// A private-use scheme: the client_id host in reverse order, then
		// ":/" and a path.
		cu, err := url.Parse(clientID)
		if err != nil {
			return invalidClient("client_id is not a URL")
		}
		labels := strings.Split(cu.Hostname(), ".")
		slices.Reverse(labels)
		if u.Scheme != strings.Join(labels, ".") || !strings.HasPrefix(raw, u.Scheme+":/") || strings.HasPrefix(raw, u.Scheme+"://") {
			return invalidClient("redirect_uri %q: a custom scheme must be the client_id host reversed, followed by ':/'", raw)
		}
		return nil
	default:
		return invalidClient("redirect_uri %q: scheme not allowed for a web client", raw)
	}
}

func isLoopbackIP(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redirectAllowed reports whether redirect matches one of the client's
// registered redirect URIs: exactly, or for loopback http URIs with any
// port (RFC 8252 section 7.3).
func redirectAllowed(c *client, redirect string) bool {
	if slices.Contains(c.Metadata.RedirectURIs, redirect) {
		return true
	}
	u, err := url.Parse(redirect)
	if err != nil || u.Scheme != "http" || !isLoopbackIP(u.Hostname()) {
		return false
	}
	for _, reg := range c.Metadata.RedirectURIs {
		r, err := url.Parse(reg)
		if err != nil || r.Scheme != "http" || !isLoopbackIP(r.Hostname()) {
			continue
		}
		if r.Hostname() == u.Hostname() && r.EscapedPath() == u.EscapedPath() && r.RawQuery == u.RawQuery {
			return true
		}
	}
	return false
}

// clientKeys returns a confidential client's assertion keys: from jwks, or
// fetched from jwks_uri (with the metadata document's limits).
func (cc *clientCache) clientKeys(ctx context.Context, md *indigo.ClientMetadata) ([]jose.JSONWebKey, error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if md.JWKSURI != nil {
		if err := checkClientIDURL(*md.JWKSURI, cc.cfg.AllowPrivateClientIDs); err != nil {
			return nil, invalidClient("jwks_uri must be a public https URL")
		}
		if err := cc.fetchJSON(ctx, *md.JWKSURI, &raw); err != nil {
			return nil, invalidClient("jwks_uri: %v", err)
		}
	} else {
		for _, k := range md.JWKS.Keys {
			b, err := json.Marshal(k)
			if err != nil {
				return nil, invalidClient("jwks: %v", err)
			}
			raw.Keys = append(raw.Keys, b)
		}
	}
	var keys []jose.JSONWebKey
	for _, b := range raw.Keys {
		var m map[string]any
		if json.Unmarshal(b, &m) == nil {
			dpop.PadJWKCoordinates(m)
			if nb, err := json.Marshal(m); err == nil {
				b = nb
			}
		}
		var k jose.JSONWebKey
		// Keys of kinds go-jose cannot read are skipped: a set may hold
		// keys for other purposes.
		if err := k.UnmarshalJSON(b); err != nil || !k.IsPublic() {
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, invalidClient("the client's key set has no usable public key")
	}
	return keys, nil
}

// localhostClient builds the virtual metadata of a development client:
// client_id http://localhost with optional redirect_uri (repeated) and
// scope query parameters.
func localhostClient(clientID string) (*client, error) {
	u, err := url.Parse(clientID)
	if err != nil || u.Scheme != "http" || u.Host != "localhost" || (u.Path != "" && u.Path != "/") || u.Fragment != "" || u.User != nil {
		return nil, invalidClient("an http client_id must be exactly http://localhost (no port, no path), with optional query parameters")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, invalidClient("client_id query: %v", err)
	}
	for k := range q {
		if k != "redirect_uri" && k != "scope" {
			return nil, invalidClient("client_id query parameter %q is not supported", k)
		}
	}
	redirects := q["redirect_uri"]
	if len(redirects) == 0 {
		redirects = []string{"http://127.0.0.1/", "http://[::1]/"}
	}
	for _, r := range redirects {
		ru, err := url.Parse(r)
		if err != nil || ru.Scheme != "http" || !isLoopbackIP(ru.Hostname()) || ru.Hostname() == "localhost" {
			return nil, invalidClient("a development client's redirect_uri must be http://127.0.0.1 or http://[::1]")
		}
	}
	if len(q["scope"]) > 1 {
		return nil, invalidClient("client_id has more than one scope parameter")
	}
	scope := q.Get("scope")
	if scope == "" {
		scope = ScopeAtproto
	}
	native, name := "native", "Development client"
	md := indigo.ClientMetadata{
		ClientID:                clientID,
		ApplicationType:         &native,
		GrantTypes:              []string{"authorization_code", "refresh_token"},
		Scope:                   scope,
		ResponseTypes:           []string{"code"},
		RedirectURIs:            redirects,
		TokenEndpointAuthMethod: "none",
		DPoPBoundAccessTokens:   true,
		ClientName:              &name,
	}
	if err := md.Validate(clientID); err != nil {
		return nil, invalidClient("%v", err)
	}
	return &client{ID: clientID, Metadata: md, Localhost: true}, nil
}

// errIsClient reports whether err is a client error rather than a fault.
func errIsClient(err error) bool {
	var oe *Error
	return errors.As(err, &oe) && oe.Status < 500
}

// ForgetClient drops a client's cached metadata, so the next request
// fetches it again (for an operator told that a client rotated a
// compromised key).
func (s *Server) ForgetClient(clientID string) {
	s.clients.mu.Lock()
	defer s.clients.mu.Unlock()
	delete(s.clients.items, clientID)
}
