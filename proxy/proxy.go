package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/prometheus/client_golang/prometheus"
)

// Service ids of the configured services, as in their DID documents.
const (
	AppViewServiceID = "bsky_appview"
	LabelerServiceID = "atproto_labeler"
)

// Defaults for Config's zero fields (the reference PDS's proxy settings).
const (
	DefaultHeaderTimeout    = 10 * time.Second
	DefaultBodyTimeout      = 30 * time.Second
	DefaultTotalTimeout     = 60 * time.Second
	DefaultMinRate          = 8 << 10
	DefaultMinRateAfter     = 10 * time.Second
	DefaultMaxResponseBytes = 10 << 20
	DefaultMaxRequestBytes  = 2 << 20
	// DefaultMaxBlobRequestBytes matches Bulwark's uploadBlob limit.
	DefaultMaxBlobRequestBytes = 100 << 20
	DefaultFeedCacheTTL        = time.Minute
	DefaultFeedCacheSize       = 1000
	DefaultUserAgent           = "bulwark-pds"
)

// Config configures a Proxy. The zero value works: it proxies nothing
// (every method is ErrNotConfigured) until a service is set.
type Config struct {
	// AppViewURL is the app view's base URL, e.g. https://api.bsky.app.
	// Empty: no app view; methods routed to it are ErrNotConfigured.
	AppViewURL string
	// AppViewDID is the app view's service DID, e.g. did:web:api.bsky.app:
	// the audience of tokens for it. Required with AppViewURL.
	AppViewDID syntax.DID
	// ModerationURL is the moderation service for tools.ozone.* (empty:
	// none).
	ModerationURL string
	// ModerationDID is the moderation service's DID.
	ModerationDID syntax.DID
	// ReportURL is where com.atproto.moderation.createReport goes without
	// an atproto-proxy header (empty: none).
	ReportURL string
	// ReportDID is the report service's DID.
	ReportDID syntax.DID

	// Resolver resolves the DIDs named by atproto-proxy headers; nil
	// refuses every header but one naming the configured app view.
	Resolver Resolver
	// Keys signs service tokens. Nil: requests go without a token even
	// for authenticated callers.
	Keys KeySource
	// Local enables read-after-write; nil disables it.
	Local LocalState

	// HTTPClient sends upstream requests. In production, the SSRF-safe
	// outbound client. Its redirect policy is replaced: redirects are
	// never followed. A Timeout on it would cut long streams; leave it
	// zero and rely on HeaderTimeout/BodyTimeout. Nil: a plain client.
	HTTPClient *http.Client
	// HeaderTimeout bounds the wait for the upstream's response headers
	// once the request is sent (default DefaultHeaderTimeout).
	HeaderTimeout time.Duration
	// BodyTimeout bounds each wait for more of the upstream's response
	// body (default DefaultBodyTimeout).
	BodyTimeout time.Duration
	// TotalTimeout bounds the whole answer, from the moment the request
	// has been sent to the last byte of the response (default
	// DefaultTotalTimeout): a service that keeps sending a byte now and
	// then cannot hold a request, and what it reserved, for longer.
	TotalTimeout time.Duration
	// MinRate is the slowest average rate, in bytes a second, an answer's
	// body may arrive at once MinRateAfter has passed since its headers
	// (defaults DefaultMinRate and DefaultMinRateAfter). An answer that
	// falls behind is cut off as a timeout.
	MinRate      int64
	MinRateAfter time.Duration
	// MaxResponseBytes bounds an upstream response body (default
	// DefaultMaxResponseBytes).
	MaxResponseBytes int64
	// MaxRequestBytes bounds a forwarded request body (default
	// DefaultMaxRequestBytes).
	MaxRequestBytes int64
	// MaxBlobRequestBytes bounds the body of methods that upload blobs
	// (IsBlobMethod; default DefaultMaxBlobRequestBytes).
	MaxBlobRequestBytes int64

	// FeedCacheTTL is how long a feed generator's DID is remembered for
	// getFeed tokens (default DefaultFeedCacheTTL).
	FeedCacheTTL time.Duration
	// FeedCacheSize bounds the feed generators remembered (default
	// DefaultFeedCacheSize).
	FeedCacheSize int

	// PublicURL is this PDS's public base URL; read-after-write views
	// point image URLs at its com.atproto.sync.getBlob when CDNURLPattern
	// is empty. With neither, spliced views carry no image URLs.
	PublicURL string
	// CDNURLPattern, when set, builds image URLs for read-after-write
	// views with fmt.Sprintf(pattern, kind, did, cid), kind being avatar,
	// banner, feed_thumbnail or feed_fullsize; e.g.
	// https://cdn.bsky.app/img/%s/plain/%s/%s@jpeg.
	CDNURLPattern string

	// VideoPlaylistPattern and VideoThumbnailPattern build the URLs of a
	// read-after-write video view with fmt.Sprintf(pattern, did, cid),
	// both path-escaped, as the app view builds its own (for Bluesky's,
	// https://video.bsky.app/watch/%s/%s/playlist.m3u8 and
	// .../thumbnail.jpg). Empty: spliced posts carry no video view.
	VideoPlaylistPattern  string
	VideoThumbnailPattern string

	// UserAgent is sent upstream (default DefaultUserAgent).
	UserAgent string
	// Registerer receives the proxy's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger logs upstream failures (default slog.Default()).
	Logger *slog.Logger
}

// Proxy routes and forwards XRPC requests. Safe for concurrent use.
type Proxy struct {
	cfg     Config
	client  *http.Client
	logger  *slog.Logger
	metrics *metrics
	feeds   *feedCache
}

// Target is where one request goes.
type Target struct {
	// URL is the service's base URL (scheme://host[:port]).
	URL string
	// DID is the service's DID: the audience of its service tokens.
	DID syntax.DID
	// ServiceID is the DID-document service id, without '#'.
	ServiceID string
	// Configured is true for the operator's services (the app view, the
	// moderation and report services), false for a service an
	// atproto-proxy header names, which anyone may run.
	Configured bool
}

// New checks cfg and returns a Proxy.
func New(cfg Config) (*Proxy, error) {
	if err := checkService("app view", &cfg.AppViewURL, cfg.AppViewDID); err != nil {
		return nil, err
	}
	if err := checkService("moderation service", &cfg.ModerationURL, cfg.ModerationDID); err != nil {
		return nil, err
	}
	if err := checkService("report service", &cfg.ReportURL, cfg.ReportDID); err != nil {
		return nil, err
	}
	setDefaults(&cfg)
	client := &http.Client{}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient // shares the transport and its connection pool
		client = &c
	} else {
		client.Transport = defaultTransport()
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, client: client, logger: cfg.Logger.With("component", "proxy"), metrics: m}
	p.feeds = newFeedCache(cfg.FeedCacheSize, cfg.FeedCacheTTL)
	return p, nil
}

func setDefaults(cfg *Config) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def64 := func(n *int64, v int64) {
		if *n <= 0 {
			*n = v
		}
	}
	def(&cfg.HeaderTimeout, DefaultHeaderTimeout)
	def(&cfg.BodyTimeout, DefaultBodyTimeout)
	def(&cfg.TotalTimeout, DefaultTotalTimeout)
	def(&cfg.MinRateAfter, DefaultMinRateAfter)
	def64(&cfg.MinRate, DefaultMinRate)
	def(&cfg.FeedCacheTTL, DefaultFeedCacheTTL)
	def64(&cfg.MaxResponseBytes, DefaultMaxResponseBytes)
	def64(&cfg.MaxRequestBytes, DefaultMaxRequestBytes)
	def64(&cfg.MaxBlobRequestBytes, DefaultMaxBlobRequestBytes)
	if cfg.FeedCacheSize <= 0 {
		cfg.FeedCacheSize = DefaultFeedCacheSize
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = DefaultUserAgent
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.PublicURL = strings.TrimSuffix(cfg.PublicURL, "/")
}

// checkService normalises a configured service URL to its origin; an
// operator's URL may be http (a local app view).
func checkService(what string, rawURL *string, did syntax.DID) error {
	if *rawURL == "" {
		return nil
	}
	origin := endpointOrigin(*rawURL, true)
	if origin == "" {
		return fmt.Errorf("proxy: %s URL %q is not an absolute http(s) URL", what, *rawURL)
	}
	if _, err := syntax.ParseDID(string(did)); err != nil {
		return fmt.Errorf("proxy: %s %s needs a valid DID: %w", what, *rawURL, err)
	}
	*rawURL = origin
	return nil
}

func defaultTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}

// Target picks the service for a request to nsid. header is the
// atproto-proxy header value ("" when absent). With a header, its DID is
// resolved (the configured app view is used as is when the header names
// it); without one, tools.ozone.* goes to the moderation service,
// com.atproto.moderation.createReport to the report service and
// everything else to the app view. Errors are *Error wrapping
// ErrBadHeader, ErrUnknownDID, ErrUnknownService, ErrResolution or
// ErrNotConfigured.
func (p *Proxy) Target(ctx context.Context, nsid syntax.NSID, header string) (Target, error) {
	if header != "" {
		return p.headerTarget(ctx, header)
	}
	name := string(nsid)
	switch {
	case strings.HasPrefix(name, "tools.ozone."):
		return p.configured(nsid, p.cfg.ModerationURL, p.cfg.ModerationDID, LabelerServiceID)
	case name == "com.atproto.moderation.createReport":
		return p.configured(nsid, p.cfg.ReportURL, p.cfg.ReportDID, LabelerServiceID)
	default:
		return p.configured(nsid, p.cfg.AppViewURL, p.cfg.AppViewDID, AppViewServiceID)
	}
}

func (p *Proxy) configured(nsid syntax.NSID, url string, did syntax.DID, id string) (Target, error) {
	if url == "" {
		return Target{}, newError(ErrNotConfigured, nil, "no service configured for %s", nsid)
	}
	return Target{URL: url, DID: did, ServiceID: id, Configured: true}, nil
}

func (p *Proxy) headerTarget(ctx context.Context, header string) (Target, error) {
	did, id, err := ParseHeader(header)
	if err != nil {
		return Target{}, err
	}
	if p.cfg.AppViewURL != "" && did == p.cfg.AppViewDID && id == AppViewServiceID {
		return Target{URL: p.cfg.AppViewURL, DID: did, ServiceID: id, Configured: true}, nil
	}
	if p.cfg.Resolver == nil {
		return Target{}, newError(ErrUnknownDID, nil, "could not resolve proxy DID %s", did)
	}
	endpoint, err := p.cfg.Resolver.ResolveService(ctx, did, id)
	if err != nil {
		return Target{}, asError(err, ErrResolution, "could not resolve proxy DID %s", did)
	}
	t := Target{URL: strings.TrimSuffix(endpoint, "/"), DID: did, ServiceID: id}
	// A header that names an operator's service where the operator
	// configured it goes there as configured.
	t.Configured = (t.URL == p.cfg.ModerationURL && did == p.cfg.ModerationDID) ||
		(t.URL == p.cfg.ReportURL && did == p.cfg.ReportDID) ||
		(t.URL == p.cfg.AppViewURL && did == p.cfg.AppViewDID)
	return t, nil
}

// asError passes an *Error through and wraps anything else (a Resolver
// that is not ours) in sentinel.
func asError(err error, sentinel error, format string, args ...any) error {
	if _, ok := err.(*Error); ok {
		return err
	}
	return newError(sentinel, err, format, args...)
}

// Serve is the whole proxy path for one request: policy (Check), routing
// (Target, from the request's atproto-proxy header), then Forward. It
// returns an error only when nothing was written; the caller answers it.
// See Forward for what happens once the response has started.
func (p *Proxy) Serve(w http.ResponseWriter, r *http.Request, nsid syntax.NSID, c Caller) error {
	if err := Check(nsid, c); err != nil {
		return err
	}
	t, err := p.RequestTarget(r, nsid)
	if err != nil {
		return err
	}
	return p.Forward(w, r, nsid, t, c)
}

// RequestTarget is Target for r: its atproto-proxy header, of which there
// may be at most one, not empty.
func (p *Proxy) RequestTarget(r *http.Request, nsid syntax.NSID) (Target, error) {
	headers := r.Header.Values(HeaderName)
	if len(headers) > 1 {
		return Target{}, newError(ErrBadHeader, nil, "more than one atproto-proxy header")
	}
	var header string
	if len(headers) == 1 {
		header = headers[0]
		if header == "" {
			return Target{}, newError(ErrBadHeader, nil, "empty atproto-proxy header")
		}
	}
	return p.Target(r.Context(), nsid, header)
}
