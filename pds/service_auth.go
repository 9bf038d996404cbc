package pds

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
)

// protectedMethods are account-management methods a service-auth token is
// never issued for: they must be called directly with a session (the
// reference PDS's PROTECTED_METHODS).
var protectedMethods = map[string]bool{
	"com.atproto.admin.sendEmail":                       true,
	"com.atproto.identity.requestPlcOperationSignature": true,
	"com.atproto.identity.signPlcOperation":             true,
	"com.atproto.identity.updateHandle":                 true,
	"com.atproto.server.activateAccount":                true,
	"com.atproto.server.confirmEmail":                   true,
	"com.atproto.server.createAppPassword":              true,
	"com.atproto.server.deactivateAccount":              true,
	"com.atproto.server.getAccountInviteCodes":          true,
	"com.atproto.server.getSession":                     true,
	"com.atproto.server.listAppPasswords":               true,
	"com.atproto.server.requestAccountDelete":           true,
	"com.atproto.server.requestEmailConfirmation":       true,
	"com.atproto.server.requestEmailUpdate":             true,
	"com.atproto.server.revokeAppPassword":              true,
	"com.atproto.server.updateEmail":                    true,
}

// privilegedMethods need a full-access or privileged app-password session
// (the reference PDS's PRIVILEGED_METHODS: chat, and createAccount).
func privilegedMethod(lxm string) bool {
	return strings.HasPrefix(lxm, "chat.bsky.") || lxm == "com.atproto.server.createAccount"
}

// registerServiceAuthRoutes registers com.atproto.server.getServiceAuth.
func (s *Server) registerServiceAuthRoutes() {
	if s.accounts == nil {
		return
	}
	s.query("com.atproto.server.getServiceAuth", s.handleGetServiceAuth)
}

func (s *Server) handleGetServiceAuth(w http.ResponseWriter, r *http.Request) error {
	auth, err := s.requireAuth(r, oauthAnyGrant())
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
	if lxm != "" {
		if _, err := syntax.ParseNSID(lxm); err != nil {
			return InvalidRequest("lxm %q is not an NSID", lxm)
		}
		if protectedMethods[lxm] {
			return InvalidRequest("cannot request a service auth token for the protected method %s", lxm)
		}
	}
	// A token without lxm is one for any method: an OAuth session needs
	// rpc:* for it.
	if err := checkRPCAccess(auth, lxm, aud); err != nil {
		return err
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
