package pds

import (
	"errors"
	"net/http"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/proxy"
	"github.com/bulwark-pds/bulwark/repo"
)

// OAuth on the resource side: requests carrying "Authorization: DPoP
// <token>" and a DPoP proof are verified by package oauth, and each method
// then checks the permission it needs in the granted scope. The rules:
//
//   - repo writes: repo:<collection>?action=<create|update|delete> for each
//     write (putRecord, an upsert, needs create and update);
//   - uploadBlob: blob:<mime>;
//   - getSession: any grant; the email only with account:email (or
//     transition:email);
//   - updateHandle: identity:handle; PLC operations (requesting,
//     signing, submitting): identity:*; the email (requesting a change or
//     a confirmation, updating, confirming): account:email?action=manage;
//     importRepo: account:repo?action=manage (oauthAccount,
//     oauthIdentity);
//   - getServiceAuth and the service proxy: rpc:<lxm>?aud=<did>#<service>
//     (checkRPCAccess; the proxy asks account.Auth.AllowsRPC through
//     proxy.Caller.Permits once it knows the target);
//   - other methods that need a password session (app passwords, invite
//     codes, activation, deletion) are refused to OAuth whatever the scope;
//   - everything else (preferences, reads that need a session, ...) needs
//     transition:generic, the app-password level.
//
// A refusal is 403 InsufficientScope with a WWW-Authenticate challenge
// (RFC 6750's insufficient_scope) naming what is missing.

// oauthNeed is a method's OAuth requirement (authPolicy.oauth): check
// reports whether the grant allows the call, need names the missing
// permission in the refusal. A nil check allows any grant (the handler
// checks more itself, as the repo writes do).
type oauthNeed struct {
	need  string
	check func(*oauth.AccessInfo) bool
}

// oauthAllows sets what an OAuth session needs for the method, in place of
// the default (transition:generic, or a refusal for methods that need a
// password session).
func oauthAllows(need string, check func(*oauth.AccessInfo) bool) authOption {
	return func(p *authPolicy) { p.oauth = &oauthNeed{need: need, check: check} }
}

// oauthAnyGrant lets every OAuth session call the method; the handler
// checks the permissions itself.
func oauthAnyGrant() authOption { return oauthAllows("", nil) }

// oauthAccount lets an OAuth session with account:<attr>?action=<action>
// call the method (updateEmail: "email", manage; importRepo: "repo",
// manage).
func oauthAccount(attr, action string) authOption {
	return oauthAllows("account:"+attr+"?action="+action, func(a *oauth.AccessInfo) bool { return a.CanAccount(attr, action) })
}

// oauthIdentity lets an OAuth session with identity:<attr> call the method
// (updateHandle: "handle"; PLC operations: "*").
func oauthIdentity(attr string) authOption {
	return oauthAllows("identity:"+attr, func(a *oauth.AccessInfo) bool { return a.CanIdentity(attr) })
}

// isDPoPAuth reports whether the request's Authorization header uses the
// DPoP scheme.
func isDPoPAuth(r *http.Request) bool {
	scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return strings.EqualFold(scheme, "DPoP")
}

// requireOAuth is requireAuth for an OAuth access token: the token, its
// DPoP proof and its grant (package oauth), the account's state, then the
// method's permission.
func (s *Server) requireOAuth(r *http.Request, p authPolicy) (*account.Auth, error) {
	info, err := s.oauth.Authenticate(r)
	var ae *oauth.AuthError
	if errors.As(err, &ae) {
		return nil, oauthAuthError(ae)
	}
	if err != nil {
		return nil, err
	}
	a, err := s.accounts.Get(r.Context(), info.DID)
	if errors.Is(err, account.ErrAccountNotFound) {
		return nil, oauthAuthError(&oauth.AuthError{Status: http.StatusUnauthorized, Code: oauth.CodeInvalidToken, Description: "the account no longer exists"})
	}
	if err != nil {
		return nil, err
	}
	auth := &account.Auth{DID: a.DID, Handle: a.Handle, Status: a.Status, Scope: info.Scope(), SessionID: info.GrantID, OAuth: info}
	switch {
	case a.Status == account.StatusTakendown && !p.allowTakendown:
		return nil, account.ErrAccountTakendown
	case a.Status == account.StatusDeactivated && !p.allowDeactivated:
		return nil, account.ErrAccountDeactivated
	}
	switch {
	case p.oauth != nil:
		if p.oauth.check != nil && !p.oauth.check(info) {
			return nil, insufficientScope(p.oauth.need)
		}
	case p.fullAccess || p.privileged:
		return nil, insufficientScope("")
	case !info.Generic():
		return nil, insufficientScope(oauth.ScopeGeneric)
	}
	return auth, nil
}

// oauthAuthError is what package oauth's WriteAuthError answers, as an
// XRPC error: the status, the WWW-Authenticate challenge, and the OAuth
// code as the error name (clients read both to retry with a nonce or to
// refresh). serveXRPC has already set the DPoP-Nonce header.
func oauthAuthError(ae *oauth.AuthError) *XRPCError {
	e := newError(ae.Status, ae.Code, "%s", ae.Description)
	e.Header = http.Header{"WWW-Authenticate": {ae.WWWAuthenticate()}}
	e.Err = ae
	return e
}

// insufficientScope is the 403 for an OAuth session whose grant lacks the
// permission a method needs; need names it ("" for methods no grant
// reaches).
func insufficientScope(need string) *XRPCError {
	msg := "this app's access to the account does not include this method; it needs the account password"
	challenge := `DPoP algs="ES256", error="insufficient_scope", error_description="Missing required scope"`
	if need != "" {
		msg = "this app's access to the account does not include this: it needs the permission " + need
		challenge += `, scope="` + strings.ReplaceAll(need, `"`, `'`) + `"`
	}
	e := newError(http.StatusForbidden, "InsufficientScope", "%s", msg)
	e.Header = http.Header{"WWW-Authenticate": {challenge}}
	return e
}

// checkRepoScope refuses writes an OAuth session's grant does not cover:
// each write needs repo:<collection> with its action. extra are actions
// every write needs as well (putRecord, which creates or replaces, needs
// create too).
func checkRepoScope(a *account.Auth, writes []repo.Write, extra ...string) error {
	if a == nil || a.OAuth == nil {
		return nil
	}
	for _, w := range writes {
		for _, action := range append([]string{string(w.Action)}, extra...) {
			if !a.OAuth.CanRepo(w.Collection.String(), action) {
				return insufficientScope("repo:" + w.Collection.String() + "?action=" + action)
			}
		}
	}
	return nil
}

// checkRPCAccess is what a session needs to call lxm on the service aud
// (a did#service reference or a bare DID) through the service proxy or
// with a service-auth token: a privileged method (chat, createAccount)
// needs a full-access or privileged app-password session, and an OAuth
// session the grant's rpc: permission for it (transition:generic covers
// all but chat, which transition:chat.bsky adds). Protected methods are
// the caller's to refuse first. Authenticate with oauthAnyGrant, so that
// a grant of rpc: permissions alone gets this far.
func checkRPCAccess(a *account.Auth, lxm, aud string) error {
	if a.OAuth == nil {
		if lxm != "" && proxy.IsPrivileged(syntax.NSID(lxm)) && !a.Privileged() {
			return InvalidRequest("insufficient access to request a service auth token for %s", lxm)
		}
		return nil
	}
	if !a.AllowsRPC(lxm, aud) {
		if lxm == "" {
			lxm = "*"
		}
		return insufficientScope("rpc:" + lxm + "?aud=" + aud)
	}
	return nil
}

// withDPoPNonce gives every response to a DPoP-authorised XRPC request the
// current DPoP nonce, as RFC 9449 asks of a resource server, so a client
// keeps its proofs fresh without an extra round trip.
func (s *Server) withDPoPNonce(next http.HandlerFunc) http.HandlerFunc {
	if s.oauth == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if isDPoPAuth(r) {
			w.Header().Set("DPoP-Nonce", s.oauth.DPoPNonce())
		}
		next(w, r)
	}
}
