package outbound

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"time"
)

// Defaults of a zero Config.
const (
	// DefaultTimeout bounds a whole request, response body included.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxResponseBytes bounds a response body.
	DefaultMaxResponseBytes = 1 << 20
	// DefaultUserAgent is sent by requests that carry no User-Agent.
	DefaultUserAgent = "bulwark-pds"
)

// Transport bounds that are not configurable.
const (
	tlsHandshakeTimeout    = 5 * time.Second
	maxResponseHeaderBytes = 64 << 10
	idleConnTimeout        = 30 * time.Second
)

// Errors. All of them survive the *url.Error wrapping of net/http:
// errors.Is(err, ErrForbiddenAddress) works on what Do returns.
var (
	// ErrForbiddenAddress means the destination resolved only to addresses
	// the client may not connect to (loopback, private, link-local, ...).
	// Nothing was sent to it.
	ErrForbiddenAddress = errors.New("outbound: destination address not allowed")
	// ErrForbiddenScheme means the URL was not https, or was plain http to
	// an address outside Config.AllowCIDRs. Nothing was sent.
	ErrForbiddenScheme = errors.New("outbound: URL scheme not allowed")
	// ErrRedirect means the server answered with a redirect the call did
	// not allow (or one more than it allowed). The redirect was not
	// followed.
	ErrRedirect = errors.New("outbound: redirect not followed")
	// ErrResponseTooLarge means the response body was longer than the
	// call's limit.
	ErrResponseTooLarge = errors.New("outbound: response too large")
)

// errPlainHTTP is the refusal of the plain-http dialer.
var errPlainHTTP = fmt.Errorf("%w: plain http is allowed only to Config.AllowCIDRs", ErrForbiddenScheme)

// Refused reports whether err is the guard refusing a request (a forbidden
// address or scheme, or a redirect it would not follow) rather than the
// remote end failing. Callers answering untrusted clients should report a
// refusal exactly as they report "not found", so that the answer says
// nothing about what lies behind a refused address.
func Refused(err error) bool {
	return errors.Is(err, ErrForbiddenAddress) || errors.Is(err, ErrForbiddenScheme) || errors.Is(err, ErrRedirect)
}

// Resolver looks up host addresses and TXT records. *net.Resolver
// implements it; tests inject their own.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// Config tunes a Client. The zero value is a client that reaches public
// unicast addresses over https only.
type Config struct {
	// AllowCIDRs are networks the client may reach although they are not
	// public (a private deployment's services, tests on 127.0.0.1). An
	// address inside one of them may also be reached over plain http;
	// every other address only over https.
	AllowCIDRs []netip.Prefix
	// Timeout bounds a whole request: connection, headers and body.
	// Zero: DefaultTimeout.
	Timeout time.Duration
	// MaxResponseBytes bounds a response body unless a call passes
	// WithMaxBytes. Zero: DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// MaxRedirects is how many redirects a call follows unless it passes
	// WithRedirects; each hop is checked like the first request. Zero:
	// none (the call fails with ErrRedirect).
	MaxRedirects int
	// UserAgent is sent by requests that carry none. Empty:
	// DefaultUserAgent.
	UserAgent string
	// Resolver looks up names for dialling and handle TXT records. Nil:
	// net.DefaultResolver.
	Resolver Resolver
	// RootCAs verify servers' certificates. Nil: the system roots.
	RootCAs *x509.CertPool
	// Logger receives refusals at debug level. Nil: slog.Default().
	Logger *slog.Logger
	// DialPorts maps a "host:port" the client would dial to another port
	// on the same host, whose addresses are checked as ever: for tests
	// that serve https://name/ URLs (handle well-knowns, did:web) from a
	// local listener. Nil in production.
	DialPorts map[string]string
}

// Client makes HTTP requests to URLs that users influence. It is safe for
// concurrent use; make one per process and share it.
type Client struct {
	cfg      Config
	log      *slog.Logger
	resolver Resolver
	https    *http.Transport
	plain    *http.Transport // nil when AllowCIDRs is empty: no plain http at all
}

// New returns a client for cfg.
func New(cfg Config) *Client { return newClient(cfg, cfg.DialPorts) }

// newClient is New with a port map for tests (see guard.ports).
func newClient(cfg Config, ports map[string]string) *Client {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.MaxRedirects < 0 {
		cfg.MaxRedirects = 0
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = DefaultUserAgent
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Client{cfg: cfg, log: cfg.Logger.With("component", "outbound"), resolver: cfg.Resolver}
	if c.resolver == nil {
		c.resolver = net.DefaultResolver
	}
	c.https = c.transport(newGuard(cfg.AllowCIDRs, true, ErrForbiddenAddress, c.resolver, c.log, ports))
	if len(cfg.AllowCIDRs) > 0 {
		c.plain = c.transport(newGuard(cfg.AllowCIDRs, false, errPlainHTTP, c.resolver, c.log, ports))
	}
	return c
}

func (c *Client) transport(g *guard) *http.Transport {
	return &http.Transport{
		Proxy:                  nil, // never HTTP_PROXY: a proxy would dial what the guard refuses
		DialContext:            g.DialContext,
		TLSClientConfig:        &tls.Config{RootCAs: c.cfg.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    tlsHandshakeTimeout,
		ResponseHeaderTimeout:  c.cfg.Timeout,
		ExpectContinueTimeout:  time.Second,
		IdleConnTimeout:        idleConnTimeout,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    4,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		ForceAttemptHTTP2:      true,
	}
}

// CloseIdleConnections closes kept-alive connections.
func (c *Client) CloseIdleConnections() {
	c.https.CloseIdleConnections()
	if c.plain != nil {
		c.plain.CloseIdleConnections()
	}
}

// Option changes one call's bounds.
type Option func(*callOptions)

type callOptions struct {
	maxBytes  int64
	redirects int
	timeout   time.Duration
}

// WithMaxBytes bounds this call's response body to n bytes.
func WithMaxBytes(n int64) Option {
	return func(o *callOptions) {
		if n > 0 {
			o.maxBytes = n
		}
	}
}

// WithRedirects lets this call follow up to n redirects, each checked
// (scheme and address) like the first request. 0 follows none.
func WithRedirects(n int) Option {
	return func(o *callOptions) { o.redirects = max(n, 0) }
}

// WithTimeout bounds this call (connection, headers and body) to d.
func WithTimeout(d time.Duration) Option {
	return func(o *callOptions) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// HTTPClient returns an *http.Client with the client's default bounds, for
// libraries that take one (indigo's identity directory, OAuth client
// metadata fetches). Each call returns a new *http.Client sharing the
// connection pools; changing it does not change the Client.
func (c *Client) HTTPClient() *http.Client {
	return c.httpClient(callOptions{c.cfg.MaxResponseBytes, c.cfg.MaxRedirects, c.cfg.Timeout})
}

// Transport returns the client's guarded round tripper with response
// bodies bounded to maxBytes (zero or less: the client's default), for a
// caller that drives its own http.Client: one that sets its own redirect
// policy and per-read time limits, such as the service proxy, where a
// whole-request Timeout would cut long answers.
func (c *Client) Transport(maxBytes int64) http.RoundTripper {
	if maxBytes <= 0 {
		maxBytes = c.cfg.MaxResponseBytes
	}
	return &roundTripper{c: c, maxBytes: maxBytes}
}

func (c *Client) httpClient(o callOptions) *http.Client {
	return &http.Client{
		Transport:     &roundTripper{c: c, maxBytes: o.maxBytes},
		CheckRedirect: checkRedirect(o.redirects),
		Timeout:       o.timeout,
	}
}

// Do sends req within the client's bounds, changed by opts. As with
// http.Client, the caller closes the response body; reading more than the
// limit fails with ErrResponseTooLarge.
func (c *Client) Do(req *http.Request, opts ...Option) (*http.Response, error) {
	o := callOptions{c.cfg.MaxResponseBytes, c.cfg.MaxRedirects, c.cfg.Timeout}
	for _, opt := range opts {
		opt(&o)
	}
	return c.httpClient(o).Do(req)
}

// StatusError is a response whose status is not 2xx.
type StatusError struct {
	URL        string
	StatusCode int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("outbound: GET %s: HTTP %d", e.URL, e.StatusCode)
}

// GetJSON fetches rawURL and decodes its JSON body into dst. maxBytes
// bounds the body (0: the client's default). A non-2xx answer is a
// *StatusError.
func (c *Client) GetJSON(ctx context.Context, rawURL string, maxBytes int64, dst any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.Do(req, WithMaxBytes(maxBytes))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &StatusError{URL: req.URL.Redacted(), StatusCode: resp.StatusCode}
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("outbound: GET %s: %w", req.URL.Redacted(), err)
	}
	if err := json.Unmarshal(body, dst); err != nil {
		return fmt.Errorf("outbound: GET %s: decoding JSON: %w", req.URL.Redacted(), err)
	}
	return nil
}

// checkRedirect allows up to limit redirects. The scheme of each hop is
// checked by roundTripper and its address by the guard, exactly as for
// the first request.
func checkRedirect(limit int) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) > limit {
			return fmt.Errorf("%w: to %s (%d allowed)", ErrRedirect, req.URL.Redacted(), limit)
		}
		return nil
	}
}

// roundTripper sends https through the public-or-allowed transport and
// plain http through the allowed-only one, and bounds response bodies.
type roundTripper struct {
	c        *Client
	maxBytes int64
}

func (rt *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	t, err := rt.c.transportFor(req.URL)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	if req.Header.Get("User-Agent") == "" {
		req = req.Clone(req.Context())
		req.Header.Set("User-Agent", rt.c.cfg.UserAgent)
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if req.Method != http.MethodHead && resp.ContentLength > rt.maxBytes {
		resp.Body.Close()
		return nil, fmt.Errorf("%w: %d bytes announced, at most %d allowed", ErrResponseTooLarge, resp.ContentLength, rt.maxBytes)
	}
	resp.Body = &limitedBody{rc: resp.Body, left: rt.maxBytes, max: rt.maxBytes}
	return resp, nil
}

func (c *Client) transportFor(u *url.URL) (*http.Transport, error) {
	switch u.Scheme {
	case "https":
		return c.https, nil
	case "http":
		if c.plain != nil {
			return c.plain, nil
		}
		return nil, fmt.Errorf("%w: http://%s: only https is allowed", ErrForbiddenScheme, u.Host)
	}
	return nil, fmt.Errorf("%w: %q", ErrForbiddenScheme, u.Scheme)
}

// limitedBody fails with ErrResponseTooLarge once more than max bytes
// have been read.
type limitedBody struct {
	rc   io.ReadCloser
	left int64
	max  int64
	err  error
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	// Ask for one byte past the limit to tell "exactly max" from "more".
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.rc.Read(p)
	if int64(n) > b.left {
		n = int(b.left)
		b.left = 0
		b.err = fmt.Errorf("%w: more than %d bytes", ErrResponseTooLarge, b.max)
		return n, b.err
	}
	b.left -= int64(n)
	b.err = err
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
