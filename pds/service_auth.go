package pds

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/proxy"
)

// registerServiceAuthRoutes registers com.atproto.server.getServiceAuth.
func (s *Server) registerServiceAuthRoutes() {
	if s.accounts == nil {
		return
	}
	s.query("com.atproto.server.getServiceAuth", s.handleGetServiceAuth)
}

// createAccountNSID is the one method a taken-down account may mint a
// service-auth token for: moving to another server.
const createAccountNSID = "com.atproto.server.createAccount"

func (s *Server) handleGetServiceAuth(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, allowTakendown(), oauthAnyGrant())
	if err != nil {
		return err
	}
	p := queryParams(r)
	aud := p.required("aud")
	expRaw := p.optional("exp")
	lxm := p.optional("lxm")
	if err := p.Err(); err != nil {
		return err
	}
	did, _, _ := strings.Cut(aud, "#")
	if _, err := syntax.ParseDID(did); err != nil {
		return InvalidRequest("aud must be a DID or a did#service reference, not %q", aud)
	}
	if (auth.Status == account.StatusTakendown || auth.Takendown()) && lxm != createAccountNSID {
		return tokenInvalid("Bad token scope: a taken-down account may only request a service auth token for " + createAccountNSID)
	}
	if lxm != "" {
		nsid, err := syntax.ParseNSID(lxm)
		if err != nil {
			return InvalidRequest("lxm %q is not an NSID", lxm)
		}
		// The service proxy's policy: what it never forwards, no token is
		// minted for either.
		if proxy.IsProtected(nsid) {
			return InvalidRequest("cannot request a service auth token for the protected method %s", lxm)
		}
	}
	// A token without lxm is one for any method: an OAuth session needs
	// rpc:* for it. createAccount is privileged; a taken-down account's
	// session, made with the account password, may have it to move away
	// (the reference PDS means to allow this, but its privileged-method
	// check refuses its own takendown scope).
	if !auth.Takendown() {
		if err := checkRPCAccess(auth, lxm, aud); err != nil {
			return err
		}
	}
	ttl := account.ServiceAuthDefaultTTL
	if expRaw != "" {
		exp, err := strconv.ParseInt(expRaw, 10, 64)
		if err != nil {
			return InvalidRequest("exp must be a Unix time in seconds, not %q", expRaw)
		}
		ttl = time.Until(time.Unix(exp, 0))
		switch {
		case ttl < 0:
			return newError(http.StatusBadRequest, "BadExpiration", "expiration is in the past")
		case ttl > account.ServiceAuthMaxTTL:
			return newError(http.StatusBadRequest, "BadExpiration", "cannot request a token that expires more than an hour from now")
		case lxm == "" && ttl > account.ServiceAuthMaxTTLNoMethod:
			return newError(http.StatusBadRequest, "BadExpiration", "a token without lxm cannot expire more than a minute from now")
		}
	}
	token, err := s.accounts.ServiceAuthToken(r.Context(), auth.DID, aud, lxm, ttl)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, map[string]string{"token": token})
}
