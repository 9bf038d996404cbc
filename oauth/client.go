package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	indigo "github.com/bluesky-social/indigo/atproto/auth/oauth"
	"github.com/go-jose/go-jose/v4"

	"github.com/bulwark-pds/bulwark/oauth/dpop"
)

// Client metadata fetching limits.
const (
	// MaxClientIDLen bounds a client_id (it is stored and shown).
	MaxClientIDLen = 2048
	// MaxDocumentBytes bounds a client metadata or JWKS document.
	MaxDocumentBytes = 64 << 10
	// DefaultFetchTimeout bounds the fetch of a client's documents
	// (metadata and key set together).
	DefaultFetchTimeout = 5 * time.Second
	// DefaultClientCacheTTL is how long a fetched document is used. Short
	// enough that a confidential client's removed key stops working soon.
	DefaultClientCacheTTL = 10 * time.Minute
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

// load validates clientID and builds its client, fetching its metadata
// (and key set) for an https client_id. size is the bytes fetched.
func (cc *clientCache) load(ctx context.Context, clientID string) (c *client, size int, err error) {
	if len(clientID) > MaxClientIDLen {
		return nil, 0, invalidClient("client_id is longer than %d bytes", MaxClientIDLen)
	}
	if strings.HasPrefix(clientID, "http://") {
		if cc.cfg.DisableLocalhostClients {
			return nil, 0, invalidClient("development (http://localhost) clients are not allowed on this server")
		}
		c, err := localhostClient(clientID)
		return c, 0, err
	}
	if err := checkClientIDURL(clientID, cc.cfg.AllowPrivateClientIDs); err != nil {
		return nil, 0, err
	}
	var md indigo.ClientMetadata
	size, err = cc.fetchJSON(ctx, clientID, &md)
	if err != nil {
		return nil, size, cc.fetchFailed(clientID, "the client metadata document", clientID, err)
	}
	if err := md.Validate(clientID); err != nil {
		return nil, size, invalidClient("%v", err)
	}
	c = &client{ID: clientID, Metadata: md}
	if err := checkMetadata(c); err != nil {
		return nil, size, err
	}
	if c.confidential() {
		keys, n, err := cc.clientKeys(ctx, clientID, &md)
		size += n
		if err != nil {
			return nil, size, err
		}
		c.Keys = keys
	}
	return c, size, nil
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
// fetched from jwks_uri (with the metadata document's limits). size is
// the bytes fetched.
func (cc *clientCache) clientKeys(ctx context.Context, clientID string, md *indigo.ClientMetadata) (keys []jose.JSONWebKey, size int, err error) {
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if md.JWKSURI != nil {
		if err := checkClientIDURL(*md.JWKSURI, cc.cfg.AllowPrivateClientIDs); err != nil {
			return nil, 0, invalidClient("jwks_uri must be a public https URL")
		}
		size, err = cc.fetchJSON(ctx, *md.JWKSURI, &raw)
		if err != nil {
			return nil, size, cc.fetchFailed(clientID, "the key set at jwks_uri", *md.JWKSURI, err)
		}
	} else {
		for _, k := range md.JWKS.Keys {
			b, err := json.Marshal(k)
			if err != nil {
				return nil, 0, invalidClient("jwks: %v", err)
			}
			raw.Keys = append(raw.Keys, b)
		}
	}
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
		return nil, size, invalidClient("the client's key set has no usable public key")
	}
	return keys, size, nil
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
