package pds

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/metrics"
	"github.com/bulwark-pds/bulwark/outbound"
	"github.com/bulwark-pds/bulwark/proxy"
)

// Service proxying: every XRPC method Bulwark does not serve itself goes
// to the service that does (package proxy), with a service-auth token
// for an authenticated caller. Locally served methods are served here
// even with an atproto-proxy header, as the reference PDS does.

// proxyTransportBound is the response bound handed to the outbound
// transport: none worth the name. The proxy bounds every body itself
// (--proxy-max-response, on announced and counted lengths, with an error
// naming the limit); a lower bound below it would pre-empt those errors
// with a less useful one.
const proxyTransportBound = 1 << 62

// newProxy builds the service proxy from opts, or nil when opts has no
// outbound client (then methods served elsewhere answer 501).
func newProxy(opts Options, dir *outbound.Directory, logger *slog.Logger) (*proxy.Proxy, error) {
	if opts.Outbound == nil {
		return nil, nil
	}
	cfg := opts.Config
	pc := proxy.Config{
		AppViewURL:    cfg.AppViewURL,
		AppViewDID:    syntax.DID(cfg.AppViewDID),
		ModerationURL: cfg.ModServiceURL,
		ModerationDID: syntax.DID(cfg.ModServiceDID),
		ReportURL:     cfg.ReportServiceURL,
		ReportDID:     syntax.DID(cfg.ReportServiceDID),
		// http:// endpoints only where the outbound client may use plain
		// http at all: the networks --proxy-allow-private lists.
		Resolver:            proxy.NewDocResolver(dir, proxy.ResolverConfig{AllowHTTP: len(cfg.ProxyAllowPrivate) > 0}),
		HTTPClient:          &http.Client{Transport: budgetTransport{base: opts.Outbound.Transport(proxyTransportBound), trusted: origin(cfg.AppViewURL)}},
		HeaderTimeout:       cfg.ProxyHeaderTimeout,
		BodyTimeout:         cfg.ProxyBodyTimeout,
		MaxResponseBytes:    cfg.ProxyMaxResponse,
		MaxRequestBytes:     cfg.MaxJSONBody,
		MaxBlobRequestBytes: cfg.BlobMaxBytes,
		TotalTimeout:        cfg.ProxyTotalTimeout,
		MinRate:             cfg.ProxyMinRate,
		PublicURL:           cfg.PublicURL(),
		Registerer:          metrics.Registry,
		Keys:                opts.Keys,
		Logger:              logger,
	}
	pc.VideoPlaylistPattern, pc.VideoThumbnailPattern = videoPatterns(cfg.AppViewURL)
	if opts.Repo != nil && opts.Accounts != nil {
		pc.Local = localState{repo: opts.Repo, accounts: opts.Accounts}
	}
	return proxy.New(pc)
}

// videoPatterns are the URLs of the app view's video playlists and
// thumbnails (did and cid for the two %s), for the video views
// read-after-write renders: Bluesky's video service for Bluesky's app
// view, and for any other app view the paths the reference app view
// serves them at by default, under its own URL.
func videoPatterns(appView string) (playlist, thumbnail string) {
	switch o := origin(appView); o {
	case "":
		return "", ""
	case "https://api.bsky.app":
		return "https://video.bsky.app/watch/%s/%s/playlist.m3u8", "https://video.bsky.app/watch/%s/%s/thumbnail.jpg"
	default:
		return o + "/vid/%s/%s/playlist.m3u8", o + "/vid/%s/%s/thumbnail.jpg"
	}
}

// origin is scheme://host[:port] of rawURL, as the proxy addresses a
// service ("" when rawURL has none).
func origin(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// proxyWriteGrace bounds a proxied response's first write: the upstream
// may take the feed generator lookup, its headers and its first bytes
// before there is anything to write. Every write after that pushes the
// deadline forward (streamWriter).
func (s *Server) proxyWriteGrace() time.Duration {
	return 2*s.cfg.ProxyHeaderTimeout + s.cfg.ProxyBodyTimeout + streamWriteTimeout
}

// serveProxy is Server.unknownMethod when the proxy is on. Before any
// upstream work, in order (serveXRPC has charged the global per-address
// rate limit already): the verb,
// the caller's credentials (absent is anonymous; present must be valid),
// the proxy policy, the client's count of proxied requests in flight,
// the target (the atproto-proxy header resolved), and admission to its
// pool and the in-flight budget (proxy_admission.go).
func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request) error {
	nsid, err := syntax.ParseNSID(strings.TrimPrefix(r.URL.Path, "/xrpc/"))
	if err != nil {
		return methodNotImplemented(w, r)
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		return MethodNotAllowed("GET, HEAD, POST", "%s: XRPC methods are called with GET or POST", nsid)
	}
	caller, err := s.proxyCaller(r)
	if err != nil {
		return err
	}
	if err := proxy.Check(nsid, caller); err != nil {
		if errors.Is(err, proxy.ErrProtectedMethod) {
			// Account management only this server may do, and it does
			// not: the truth is that it is not implemented here.
			return MethodNotImplemented("%s is not implemented by this server, and account-management methods are never proxied", nsid)
		}
		return proxyError(err)
	}
	leave, err := s.proxyAdmit.enter(s.proxyClientKey(r, caller))
	if err != nil {
		return err
	}
	defer leave()
	target, err := s.proxy.RequestTarget(r, nsid)
	if err != nil {
		return s.proxyFailed(w, r, nsid, err)
	}
	flow, err := s.startProxyFlow(r.Context(), s.proxyAdmit.budgets(target, caller))
	if err != nil {
		return err
	}
	defer flow.release()
	s.proxyDeadlines(w)
	pw := &proxyWriter{streamWriter: newStreamWriter(w), flow: flow}
	r = r.WithContext(withProxyFlow(r.Context(), flow))
	err = s.proxy.Forward(pw, r, nsid, target, caller)
	if err == nil {
		return nil
	}
	if refused := flow.overloaded(); refused != nil {
		return refused
	}
	return s.proxyFailed(w, r, nsid, err)
}

// proxyAllowHint is logged with a request the outbound client refused to
// send: the setting that lets it reach the service.
const proxyAllowHint = "the service is on a private address, or on plain http outside --proxy-allow-private: allow its network with --proxy-allow-private (BULWARK_PROXY_ALLOW_PRIVATE)"

// proxyFailed answers err, a proxy error from before anything was
// written. A failure of the service (502, 504, or its own error status
// passed on) is another service's, not this one's: it is logged as a
// warning, where writeError would log an error line per request all
// through an app view outage, and its 503 does not count as this
// server's overload.
func (s *Server) proxyFailed(w http.ResponseWriter, r *http.Request, nsid syntax.NSID, err error) error {
	xe := proxyError(err)
	if xe.Status != http.StatusBadGateway && xe.Status != http.StatusGatewayTimeout && !errors.Is(err, proxy.ErrUpstreamStatus) {
		return xe
	}
	args := []any{"request_id", RequestID(r.Context()), "nsid", nsid, "status", xe.Status, "error", err}
	if outbound.Refused(err) {
		args = append(args, "hint", proxyAllowHint)
	}
	s.logger.Warn("proxied request failed", args...)
	_ = writeJSON(w, xe.Status, xrpcErrorBody{Error: xe.Name, Message: xe.Message})
	return nil
}

// proxyDeadlines replaces the server's whole-exchange write deadline,
// which would cut a long answer, with a first-write grace long enough for
// the proxy's own timeouts; every write then pushes it forward
// (proxyWriter), so a client that stops reading is still dropped. The
// read deadline needs nothing: net/http lifts it once the request body is
// in.
func (s *Server) proxyDeadlines(w http.ResponseWriter) {
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.proxyWriteGrace())); err != nil {
		s.logger.Debug("cannot set write deadline", "error", err)
	}
}

// proxyError is the one place a proxy error becomes an XRPC error: the
// proxy package names its errors and their statuses itself.
func proxyError(err error) *XRPCError {
	var pe *proxy.Error
	if !errors.As(err, &pe) {
		e := InternalServerError()
		e.Err = err
		return e
	}
	xe := &XRPCError{Status: pe.Status, Name: pe.Name, Message: pe.Message, Err: err}
	if errors.Is(err, proxy.ErrNotPermitted) {
		xe.Header = insufficientScope("").Header
	}
	return xe
}
