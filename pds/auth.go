package pds

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/proxy"
	"github.com/bulwark-pds/bulwark/ratelimit"
	"github.com/bulwark-pds/bulwark/repo"
)

// Token errors are 400s named ExpiredToken / InvalidToken, as the reference
// PDS answers them (InvalidRequestError with those names); @atproto/api
// refreshes its session on a 400 ExpiredToken or any 401. The constructors
// ExpiredToken/InvalidToken in errors.go (401) are for other callers; the
// error table (domainErrors) answers the account package's token errors
// the same way.
func tokenExpired(msg string) *XRPCError {
	return newError(http.StatusBadRequest, "ExpiredToken", "%s", msg)
}

func tokenInvalid(msg string) *XRPCError {
	return newError(http.StatusBadRequest, "InvalidToken", "%s", msg)
}

// authPolicy is what requireAuth accepts beyond a valid, live session.
type authPolicy struct {
	allowDeactivated bool
	allowTakendown   bool
	fullAccess       bool // the account password, not an app password
	privileged       bool // full access or a privileged app password
	// oauth is what an OAuth session needs (nil: transition:generic, or
	// nothing reaches the method when fullAccess or privileged is set).
	oauth *oauthNeed
}

// authOption relaxes or tightens requireAuth.
type authOption func(*authPolicy)

// allowDeactivated lets a deactivated account through (getSession,
// activateAccount, checkAccountStatus, deleteSession...).
func allowDeactivated() authOption { return func(p *authPolicy) { p.allowDeactivated = true } }

// allowTakendown lets a taken-down account through, and the ScopeTakendown
// session it opens to move away (createSession's allowTakendown): the
// methods the reference PDS opens to that scope (getServiceAuth, which then
// mints only for createAccount; the PLC signing methods; deactivateAccount;
// getPreferences; createReport).
func allowTakendown() authOption { return func(p *authPolicy) { p.allowTakendown = true } }

// fullAccessOnly refuses app-password sessions: account management.
func fullAccessOnly() authOption { return func(p *authPolicy) { p.fullAccess = true } }

// privilegedOnly refuses sessions of ordinary app passwords.
func privilegedOnly() authOption { return func(p *authPolicy) { p.privileged = true } }

// bearerToken returns the request's bearer token, "" when there is no
// Authorization header, or an error when there is another kind.
func bearerToken(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", nil
	}
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || token == "" || strings.Contains(token, " ") {
		return "", tokenInvalid("malformed authorization header")
	}
	if !strings.EqualFold(scheme, "Bearer") {
		return "", tokenInvalid("unsupported authorization type " + scheme + ": use a Bearer access token")
	}
	return token, nil
}

// requireAuth authenticates the request's bearer access token and returns
// who it is. It is the helper every authenticated handler uses:
//
//	auth, err := s.requireAuth(r)
//	if err != nil {
//		return err
//	}
//	// auth.DID is the caller
//
// By default the account must be active and any session scope (including
// app passwords) is accepted; options change that. "Authorization: DPoP"
// (an OAuth access token and its DPoP proof) is requireOAuth's: a grant
// passes where its permissions reach (auth_oauth.go says which).
//
// Errors are XRPC errors: 401 AuthenticationRequired without a token, 400
// ExpiredToken / InvalidToken for a bad, expired, wrong-type or ended one,
// 401 AccountDeactivated / AccountTakedown, 400 InvalidToken "bad token
// scope" for an app password on a full-access method (as the reference
// PDS does); for OAuth, 401 with the DPoP challenge for a bad token or
// proof and 403 InsufficientScope for a method outside the grant.
func (s *Server) requireAuth(r *http.Request, opts ...authOption) (*account.Auth, error) {
	var p authPolicy
	for _, o := range opts {
		o(&p)
	}
	if s.accounts == nil {
		return nil, MethodNotImplemented("this server has no accounts configured")
	}
	if s.oauth != nil && isDPoPAuth(r) {
		return s.requireOAuth(r, p)
	}
	token, err := bearerToken(r)
	if err != nil {
		return nil, err
	}
	if token == "" {
		return nil, AuthRequired("this method needs a session: send Authorization: Bearer <accessJwt>")
	}
	a, err := s.accounts.Authenticate(r.Context(), token)
	if err != nil {
		return nil, err
	}
	// A taken-down account's session (account.ScopeTakendown) reaches
	// only the methods that let it move away, whatever the account's
	// status is now; it was made with the account password.
	takendownScope := a.Takendown()
	switch {
	case takendownScope && !p.allowTakendown:
		return nil, tokenInvalid("Bad token scope: a taken-down account's session may only export the account and move it away")
	case a.Status == account.StatusTakendown && !p.allowTakendown:
		return nil, account.ErrAccountTakendown
	case a.Status == account.StatusDeactivated && !p.allowDeactivated:
		return nil, account.ErrAccountDeactivated
	case p.fullAccess && !a.FullAccess() && !takendownScope:
		return nil, tokenInvalid("bad token scope: this method needs a session made with the account password, not an app password")
	case p.privileged && !a.Privileged() && !takendownScope:
		return nil, tokenInvalid("bad token scope: this method needs a privileged app password or the account password")
	}
	return a, nil
}

// createReportNSID is the one proxied method a taken-down account may call.
const createReportNSID = "com.atproto.moderation.createReport"

// proxyCaller is who a proxied request comes from, for the service token
// the proxy mints and its policy. Credentials are optional: a request
// without an Authorization header is anonymous and goes upstream without
// a token; credentials that are present must be valid, or the request is
// refused here as any authenticated method refuses them. A deactivated
// account may still read through the proxy (as the reference PDS allows,
// for an account migrating away); a taken-down one may not. Privileged is
// a full-access session or a privileged app password. An OAuth session
// goes where its grant's rpc: permissions reach (checkRPCAccess's rule:
// the proxy asks Permits once it knows the target), chat included when
// granted, in place of the privileged-session rule.
func (s *Server) proxyCaller(r *http.Request) (proxy.Caller, error) {
	if r.Header.Get("Authorization") == "" {
		return proxy.Caller{}, nil
	}
	opts := []authOption{allowDeactivated(), oauthAnyGrant()}
	if r.URL.Path == "/xrpc/"+createReportNSID {
		// A taken-down account may still report (appeal), as in the
		// reference PDS.
		opts = append(opts, allowTakendown())
	}
	a, err := s.requireAuth(r, opts...)
	if err != nil {
		return proxy.Caller{}, err
	}
	c := proxy.Caller{DID: a.DID, Authenticated: true, Privileged: a.Privileged()}
	if a.OAuth != nil {
		c.Privileged, c.Permits = true, a.AllowsRPC
	}
	return c, nil
}

// requireRepoAuth is requireAuth for a write to repo (a DID or handle): the
// caller must own it. Writing to another account's repo is 403 Forbidden.
// An OAuth session's permissions are checked per write (checkRepoScope).
func (s *Server) requireRepoAuth(r *http.Request, repoID string) (*account.Auth, error) {
	a, err := s.requireAuth(r, oauthAnyGrant())
	if err != nil {
		return nil, err
	}
	id, err := syntax.ParseAtIdentifier(repoID)
	if err != nil {
		return nil, InvalidRequest("repo %q is not a DID or handle", repoID)
	}
	if id.IsDID() {
		d, _ := id.AsDID()
		if d != a.DID {
			return nil, Forbidden("this session may only write to its own repository (%s), not %s", a.DID, d)
		}
		return a, nil
	}
	h, _ := id.AsHandle()
	if h.Normalize() != a.Handle {
		return nil, Forbidden("this session may only write to its own repository (%s), not %s", a.Handle, h)
	}
	return a, nil
}

// writeAuth is the authorisation of a repo write: who writes, and the
// guard that checks their session inside the commit (nil when the session
// was already checked).
type writeAuth struct {
	*account.Auth
	guard *repo.Guard
}

// requireRepoWrite authorises a write to repo. In the common case (repo is
// the token's own DID) only the token is verified here, and the session and
// account status are checked by a guard statement at the start of the
// commit's transaction, which saves a round trip per write; s.commit turns
// a refusal into the error requireAuth would have given. Anything else
// (a handle, another DID) takes requireRepoAuth's path.
func (s *Server) requireRepoWrite(r *http.Request, repoID string) (*writeAuth, error) {
	if s.accounts != nil && strings.HasPrefix(repoID, "did:") {
		if token, err := bearerToken(r); err == nil && token != "" {
			if a, err := s.accounts.ParseAccess(token); err == nil && a.DID.String() == repoID && !a.Takendown() {
				return &writeAuth{Auth: a, guard: account.WriteGuard(a)}, nil
			}
		}
	}
	a, err := s.requireRepoAuth(r, repoID)
	if err != nil {
		return nil, err
	}
	return &writeAuth{Auth: a}, nil
}

// refreshToken authenticates a refresh token (refreshSession,
// deleteSession) and returns it.
func refreshToken(r *http.Request) (string, error) {
	token, err := bearerToken(r)
	if err != nil {
		return "", err
	}
	if token == "" {
		return "", AuthRequired("this method needs the refresh token: send Authorization: Bearer <refreshJwt>")
	}
	return token, nil
}

// AdminUser is the HTTP Basic user name of admin methods.
const AdminUser = "admin"

// requireAdmin checks HTTP Basic admin:<BULWARK_ADMIN_PASSWORD>. Both parts
// are compared in constant time over their hashes, so neither the password
// nor its length leaks through timing. Failures are 401
// AuthenticationRequired with a WWW-Authenticate challenge.
//
// Failed attempts count against the address's adminAuth limit: each
// attempt spends a point before the check (so that concurrent guesses
// cannot all pass a check together) and a success gives it back. Past the
// limit every attempt from the address, right or wrong, is a 429 with
// Retry-After, so a guesser learns nothing more until the window allows.
//
//	if err := s.requireAdmin(r); err != nil {
//		return err
//	}
func (s *Server) requireAdmin(r *http.Request) error {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return adminAuthError("this method needs admin credentials (HTTP Basic, user admin)")
	}
	limiter, key := s.protect.limits.Get(ratelimit.PolicyAdminAuth), s.ipKey(r)
	if d := limiter.AllowN(key, 1); !d.Allowed {
		return rateLimitError(ratelimit.PolicyAdminAuth, d, time.Now())
	}
	want := s.cfg.AdminPassword
	uh, wu := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(AdminUser))
	ph, wp := sha256.Sum256([]byte(pass)), sha256.Sum256([]byte(want))
	okUser := subtle.ConstantTimeCompare(uh[:], wu[:])
	okPass := subtle.ConstantTimeCompare(ph[:], wp[:])
	if okUser&okPass != 1 || want == "" {
		return adminAuthError("invalid admin credentials")
	}
	limiter.Refund(key, 1)
	return nil
}

func adminAuthError(msg string) error {
	e := AuthRequired("%s", msg)
	e.Header = http.Header{"WWW-Authenticate": {`Basic realm="bulwark admin", charset="UTF-8"`}}
	return e
}

// isAdminRequest reports whether the request carries valid admin
// credentials, for methods that accept either a user or the admin.
func (s *Server) isAdminRequest(r *http.Request) bool {
	if _, _, ok := r.BasicAuth(); !ok {
		return false
	}
	return s.requireAdmin(r) == nil
}
