package pds

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/config"
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
	s.mux.HandleFunc("GET /.well-known/atproto-did", s.handleWellKnownDID)
}

func (s *Server) handleResolveHandle(w http.ResponseWriter, r *http.Request) error {
	p := queryParams(r)
	raw := p.required("handle")
	if err := p.Err(); err != nil {
		return err
	}
	h, err := syntax.ParseHandle(raw)
	if err != nil {
		return InvalidRequest("invalid handle %q: %v", raw, err)
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
		return newError(http.StatusBadRequest, "HandleNotFound", "unable to resolve handle %s", h)
	}
	ctx, cancel := context.WithTimeout(r.Context(), resolveTimeout)
	defer cancel()
	did, err := s.directory.ResolveHandle(ctx, h)
	if err != nil {
		if errors.Is(err, identity.ErrHandleNotFound) || errors.Is(err, identity.ErrHandleReservedTLD) || errors.Is(err, identity.ErrInvalidHandle) {
			return newError(http.StatusBadRequest, "HandleNotFound", "unable to resolve handle %s", h)
		}
		e := UpstreamFailure("could not resolve handle %s", h)
		e.Err = err
		return e
	}
	return writeJSON(w, http.StatusOK, map[string]string{"did": did.String()})
}

func (s *Server) handleUpdateHandle(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, fullAccessOnly(), oauthIdentity("handle"))
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
	if _, err := s.accounts.UpdateHandle(r.Context(), auth.DID, in.Handle); err != nil {
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

// identityResolver is what resolveHandle needs from indigo's directory.
type identityResolver interface {
	ResolveHandle(ctx context.Context, h syntax.Handle) (syntax.DID, error)
}

// newDirectory resolves handles not hosted here (DNS, then HTTPS
// well-known) and DIDs through the configured PLC directory, with a cache.
func newDirectory(cfg *config.Config) identityResolver {
	base := &identity.BaseDirectory{
		PLCURL:     cfg.PLCURL,
		HTTPClient: http.Client{Timeout: resolveTimeout},
		UserAgent:  "bulwark-pds",
	}
	return identity.NewCacheDirectory(base, 10_000, time.Hour, 2*time.Minute, 5*time.Minute)
}
