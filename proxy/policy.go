package proxy

import (
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Caller is who is asking, as the XRPC layer authenticated them.
type Caller struct {
	// DID is the calling account; empty when unauthenticated.
	DID syntax.DID
	// Authenticated is true when the request carried a valid session (or
	// OAuth) credential for DID. Only authenticated requests get a
	// service token.
	Authenticated bool
	// Privileged is true for a full-access session or a privileged app
	// password: what chat.bsky.* and createAccount tokens require.
	Privileged bool
	// Permits, when set, limits where the caller's requests may go (an
	// OAuth grant's rpc: permissions): it reports whether method lxm may
	// be called at aud, the target's did#service reference. Nil: no limit
	// beyond Privileged.
	Permits func(lxm, aud string) bool
}

// protectedMethods manage the account and must be called on the PDS
// itself: never proxied, never given a service token (the reference PDS's
// PROTECTED_METHODS).
var protectedMethods = map[syntax.NSID]bool{
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

// IsProtected reports whether nsid is an account-management method that is
// never proxied and for which no service token is ever minted.
func IsProtected(nsid syntax.NSID) bool {
	return protectedMethods[nsid]
}

// IsPrivileged reports whether nsid needs privileged access: every
// chat.bsky.* method, and com.atproto.server.createAccount (a token for it
// lets another PDS create the account there: migration).
func IsPrivileged(nsid syntax.NSID) bool {
	return strings.HasPrefix(string(nsid), "chat.bsky.") || nsid == "com.atproto.server.createAccount"
}

// Check applies the proxy policy: a protected method is refused
// (ErrProtectedMethod), a privileged one needs c.Privileged
// (ErrPrivilegedMethod).
func Check(nsid syntax.NSID, c Caller) error {
	if IsProtected(nsid) {
		return newError(ErrProtectedMethod, nil, "%s cannot be proxied", nsid)
	}
	if IsPrivileged(nsid) && !c.Privileged {
		return newError(ErrPrivilegedMethod, nil, "%s needs a privileged session", nsid)
	}
	return nil
}
