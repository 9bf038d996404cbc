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
		PublicURL:           cfg.PublicURL(),
		Registerer:          metrics.Registry,
		Keys:                opts.Keys,
		Logger:              logger,
	}
	if opts.Repo != nil && opts.Accounts != nil {
		pc.Local = localState{repo: opts.Repo, accounts: opts.Accounts}
	}
	return proxy.New(pc)
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
// the proxy policy, and admission to the in-flight budget.
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
	flow, err := s.startProxyFlow(r.Context())
	if err != nil {
		return err
	}
	defer flow.release()
	s.proxyDeadlines(w)
	pw := &proxyWriter{streamWriter: newStreamWriter(w), flow: flow}
	r = r.WithContext(withProxyFlow(r.Context(), flow))
	err = s.proxy.Serve(pw, r, nsid, caller)
	if err == nil {
		return nil
	}
	if refused := flow.overloaded(); refused != nil {
		return refused
	}
	xe := proxyError(err)
	if xe.Status == http.StatusBadGateway || xe.Status == http.StatusGatewayTimeout {
		// Another service failed, not this one: a warning, where
		// writeError would log an error line per request all through an
		// app view outage. Serve wrote nothing, so the answer is whole.
		s.logger.Warn("proxied request failed", "request_id", RequestID(r.Context()), "nsid", nsid, "status", xe.Status, "error", err)
		_ = writeJSON(w, xe.Status, xrpcErrorBody{Error: xe.Name, Message: xe.Message})
		return nil
	}
	return xe
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
