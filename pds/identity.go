package pds

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/outbound"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// resolveTimeout bounds resolving a handle that is not hosted here.
const resolveTimeout = 10 * time.Second

// registerIdentityRoutes registers com.atproto.identity methods and the
// well-known handle path.
func (s *Server) registerIdentityRoutes() {
	if s.accounts == nil {
		return
	}
	s.query("com.atproto.identity.resolveHandle", s.handleResolveHandle)
	s.procedure("com.atproto.identity.updateHandle", s.handleUpdateHandle)
	s.query("com.atproto.identity.getRecommendedDidCredentials", s.handleGetRecommendedDidCredentials)
	s.handle("GET /.well-known/atproto-did", ratelimit.PolicyGlobal, http.HandlerFunc(s.handleWellKnownDID))
}

// handleResolveHandle answers com.atproto.identity.resolveHandle: a hosted
// handle from the database, any other through the outbound directory (DNS,
// then the HTTPS well-known, never to an address the server may not
// reach). Every failure is the same 400 HandleNotFound, whether nothing
// answered, the answer was not a DID, or the guard refused to connect, so
// the answer tells nothing about what lies behind an address; the cause
// goes to the debug log.
func (s *Server) handleResolveHandle(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	raw := p.required("handle")
	if err := p.Err(); err != nil {
		return err
	}
	h, err := syntax.ParseHandle(raw)
	if err != nil {
		return InvalidRequest("invalid handle %q: %v", clip(raw, maxQuoted), err)
	}
	h = h.Normalize()
	a, err := s.accounts.GetByHandle(r.Context(), h)
	switch {
	case err == nil:
		return writeJSON(w, http.StatusOK, map[string]string{"did": a.DID.String()})
	case !errors.Is(err, account.ErrAccountNotFound):
		return err
	case s.accounts.IsHostedHandle(h):
		// Under our own domains only our database can answer.
		return handleNotFound()
	}
	// Resolving elsewhere makes the server send requests: limited per
	// address.
	if err := s.rateLimit(w, ratelimit.PolicyResolveHandle, s.ipKey(r), 1); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), resolveTimeout)
	defer cancel()
	did, err := s.directory.ResolveHandle(ctx, h)
	if err != nil {
		if r.Context().Err() != nil {
			return r.Context().Err() // the client went away
		}
		s.logger.Debug("handle not resolved", "request_id", RequestID(r.Context()), "handle", h, "error", err)
		if did, ok := s.resolveHandleAtAppView(ctx, h); ok {
			return writeJSON(w, http.StatusOK, map[string]string{"did": did.String()})
		}
		return handleNotFound()
	}
	return writeJSON(w, http.StatusOK, map[string]string{"did": did.String()})
}

// maxAppViewResolve bounds the app view's resolveHandle answer: a DID in
// a small JSON object.
const maxAppViewResolve = 4 << 10

// resolveHandleAtAppView asks the configured app view, when the service
// proxy is on, for a handle this server could not resolve itself (as the
// reference PDS does): its resolver may reach what this one cannot. The
// request goes through the outbound client like any other.
func (s *Server) resolveHandleAtAppView(ctx context.Context, h syntax.Handle) (syntax.DID, bool) {
	if s.proxy == nil || s.cfg.AppViewURL == "" {
		return "", false
	}
	u := strings.TrimRight(s.cfg.AppViewURL, "/") + "/xrpc/com.atproto.identity.resolveHandle?handle=" + url.QueryEscape(h.String())
	var out struct {
		DID string `json:"did"`
	}
	if err := s.outbound.GetJSON(ctx, u, maxAppViewResolve, &out); err != nil {
		s.logger.Debug("app view did not resolve the handle", "handle", h, "error", err)
		return "", false
	}
	did, err := syntax.ParseDID(out.DID)
	if err != nil {
		return "", false
	}
	return did, true
}

// handleNotFound is resolveHandle's one answer for a handle it cannot
// resolve, the reference PDS's.
func handleNotFound() *XRPCError {
	return newError(http.StatusBadRequest, "HandleNotFound", "Unable to resolve handle")
}

// handleUpdateHandle answers com.atproto.identity.updateHandle. App
// passwords may call it, as on the reference PDS (its authVerifier's
// standard access).
func (s *Server) handleUpdateHandle(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, oauthIdentity("handle"))
	if err != nil {
		return err
	}
	if err := s.limitDID(w, policyUpdateHandle, auth.DID); err != nil {
		return err
	}
	var in struct {
		Handle string `json:"handle"`
	}
	if err := decodeJSON(r, &in); err != nil {
		return err
	}
	if in.Handle == "" {
		return newError(http.StatusBadRequest, "InvalidHandle", "handle is required")
	}
	// A domain of the user's own is resolved now, through the guarded
	// client (its DNS and request timeouts bound it) and without the
	// directory's cache, and must name the caller's DID; a did:web's
	// document must name the handle.
	if _, err := s.accounts.UpdateHandle(r.Context(), auth.DID, in.Handle, account.ResolveHandlesWith(s.outbound), account.ResolveDIDsWith(s.dids)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) handleGetRecommendedDidCredentials(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, allowDeactivated())
	if err != nil {
		return err
	}
	pub, err := s.accounts.PublicKey(r.Context(), auth.DID)
	if err != nil {
		return err
	}
	doc := newDIDDocument(auth.DID, auth.Handle, pub, s.cfg.PublicURL())
	return writeJSON(w, http.StatusOK, map[string]any{
		"rotationKeys":        []string{s.accounts.RotationKey()},
		"alsoKnownAs":         doc.AlsoKnownAs,
		"verificationMethods": map[string]string{"atproto": pub.DIDKey()},
		"services": map[string]any{
			"atproto_pds": map[string]string{"type": "AtprotoPersonalDataServer", "endpoint": s.cfg.PublicURL()},
		},
	})
}

// handleWellKnownDID answers GET /.well-known/atproto-did for a hosted
// handle: the Host header names the handle (HTTPS handle verification).
func (s *Server) handleWellKnownDID(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	if h, _, ok := cutPort(host); ok {
		host = h
	}
	h, err := syntax.ParseHandle(host)
	notFound := func() {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte("no user by that name\n"))
	}
	if err != nil {
		notFound()
		return
	}
	a, err := s.accounts.GetByHandle(r.Context(), h)
	if err != nil || !a.Active() {
		notFound()
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(a.DID.String()))
}

// cutPort splits host:port; ok is false when there is no port.
func cutPort(hostport string) (host, port string, ok bool) {
	for i := len(hostport) - 1; i >= 0; i-- {
		switch hostport[i] {
		case ':':
			return hostport[:i], hostport[i+1:], true
		case ']':
			return hostport, "", false
		}
	}
	return hostport, "", false
}

// identityResolver is what resolveHandle needs from the directory.
type identityResolver interface {
	ResolveHandle(ctx context.Context, h syntax.Handle) (syntax.DID, error)
}

// newOutbound is the client of opts for requests to URLs users influence:
// Options.Outbound, or one reaching public addresses and the configured
// --proxy-allow-private networks.
func newOutbound(opts Options, logger *slog.Logger) *outbound.Client {
	if opts.Outbound != nil {
		return opts.Outbound
	}
	cfg := outbound.Config{AllowCIDRs: opts.Config.ProxyAllowPrivate, Logger: logger}
	if opts.Config.DNSServer != "" {
		cfg.Resolver = outbound.DNSResolver(opts.Config.DNSServer)
	}
	return outbound.New(cfg)
}

// newDirectory is the server's one identity directory, with one cache:
// handles not hosted here (DNS, then the HTTPS well-known) and did:web
// documents through web, did:plc at the configured PLC directory. It
// serves resolveHandle, the service-auth validator and the service proxy;
// none of them needs a DID's declared handle verified, so LookupDID does
// not spend a handle resolution on it.
func newDirectory(cfg *config.Config, web *outbound.Client, logger *slog.Logger) *outbound.Directory {
	return outbound.NewDirectory(outbound.DirectoryConfig{PLCURL: cfg.PLCURL, SkipHandleVerification: true, Logger: logger}, web)
}
