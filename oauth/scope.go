package oauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Scope values with a meaning of their own (atproto OAuth profile).
const (
	// ScopeAtproto is required in every request: the client speaks the
	// atproto profile. Alone it grants nothing but learning the account's
	// identity.
	ScopeAtproto = "atproto"
	// ScopeGeneric is what an app password grants: records, blobs,
	// preferences, service proxying, but no account management and no chat.
	ScopeGeneric = "transition:generic"
	// ScopeChat adds chat.bsky (direct messages) to ScopeGeneric.
	ScopeChat = "transition:chat.bsky"
	// ScopeEmail lets the client read the account's email address.
	ScopeEmail = "transition:email"
)

// Actions for CanRepo and CanAccount.
const (
	ActionCreate = "create"
	ActionUpdate = "update"
	ActionDelete = "delete"
	ActionRead   = "read"
	ActionManage = "manage"
)

// Limits on a requested scope string.
const (
	MaxScopeLen    = 4096
	MaxScopeTokens = 64
)

// chatPrefix is the lexicon namespace transition:generic leaves out.
const chatPrefix = "chat.bsky."

// Permissions is a parsed scope: what an access token allows. The zero
// value allows nothing.
type Permissions struct {
	scope   string
	generic bool
	chat    bool
	email   bool
	perms   []auth.Permission
}

// ParsePermissions parses a granted scope. Tokens it does not understand
// are ignored, as the permission spec asks: a newer server may have
// granted something this one cannot check, and it must then allow less,
// not refuse the token.
func ParsePermissions(scope string) *Permissions {
	p := &Permissions{scope: scope}
	for _, tok := range strings.Fields(scope) {
		switch tok {
		case ScopeAtproto:
		case ScopeGeneric:
			p.generic = true
		case ScopeChat:
			p.chat = true
		case ScopeEmail:
			p.email = true
		default:
			perm, err := auth.ParsePermissionString(tok)
			if err == nil && perm.Resource != "include" {
				p.perms = append(p.perms, *perm)
			}
		}
	}
	return p
}

// Scope is the scope string the permissions were parsed from.
func (p *Permissions) Scope() string { return p.scope }

// Generic reports whether transition:generic was granted (app-password
// level access).
func (p *Permissions) Generic() bool { return p.generic }

// Chat reports whether chat.bsky methods are allowed: transition:chat.bsky
// only works together with transition:generic.
func (p *Permissions) Chat() bool { return p.generic && p.chat }

// CanRepo reports whether records of collection may be written with action
// (ActionCreate, ActionUpdate or ActionDelete).
func (p *Permissions) CanRepo(collection, action string) bool {
	if p.generic {
		return true
	}
	for _, perm := range p.perms {
		if perm.Resource != "repo" {
			continue
		}
		if !slices.Contains(perm.Collection, "*") && !slices.Contains(perm.Collection, collection) {
			continue
		}
		if len(perm.Action) == 0 || slices.Contains(perm.Action, action) {
			return true
		}
	}
	return false
}

// CanBlob reports whether a blob of MIME type mime may be uploaded.
func (p *Permissions) CanBlob(mime string) bool {
	if p.generic {
		return true
	}
	mime = strings.ToLower(strings.TrimSpace(strings.SplitN(mime, ";", 2)[0]))
	for _, perm := range p.perms {
		if perm.Resource != "blob" {
			continue
		}
		for _, accept := range perm.Accept {
			if mimeMatches(accept, mime) {
				return true
			}
		}
	}
	return false
}

func mimeMatches(pattern, mime string) bool {
	if pattern == "*/*" {
		return true
	}
	if prefix, ok := strings.CutSuffix(pattern, "/*"); ok {
		return strings.HasPrefix(mime, strings.ToLower(prefix)+"/")
	}
	return strings.EqualFold(pattern, mime)
}

// CanRPC reports whether method lxm may be called on the service aud
// (a DID service reference such as "did:web:api.bsky.app#bsky_appview"),
// through the proxy or with a service-auth token. An empty lxm is a
// service-auth token good for any method, chat and account moves
// included: only the wildcard permission rpc:*?aud=<aud> grants it.
func (p *Permissions) CanRPC(lxm, aud string) bool {
	// transition:generic is what an app password may do: not chat unless
	// transition:chat.bsky is granted too, and never a token that lets
	// another server create this account (a move), which only an explicit
	// rpc: permission grants.
	if p.generic && lxm != "" && lxm != createAccountNSID && (!strings.HasPrefix(lxm, chatPrefix) || p.chat) {
		return true
	}
	for _, perm := range p.perms {
		if perm.Resource != "rpc" {
			continue
		}
		if !slices.Contains(perm.Endpoint, "*") && (lxm == "" || !slices.Contains(perm.Endpoint, lxm)) {
			continue
		}
		if perm.Audience == "*" || perm.Audience == aud {
			return true
		}
	}
	return false
}

// createAccountNSID is the method whose service token moves the account
// to another server.
const createAccountNSID = "com.atproto.server.createAccount"

// CanAccount reports whether the account attribute attr ("email", "repo")
// may be used with action (ActionRead or ActionManage). Manage includes
// read.
func (p *Permissions) CanAccount(attr, action string) bool {
	if attr == "email" && action == ActionRead && p.email {
		return true
	}
	for _, perm := range p.perms {
		if perm.Resource != "account" || perm.Attribute != attr {
			continue
		}
		granted := ActionRead
		if slices.Contains(perm.Action, ActionManage) {
			granted = ActionManage
		}
		if action == ActionRead || granted == ActionManage {
			return true
		}
	}
	return false
}

// CanIdentity reports whether the identity attribute attr ("handle", or
// "*" for the whole DID document) may be changed.
func (p *Permissions) CanIdentity(attr string) bool {
	for _, perm := range p.perms {
		if perm.Resource == "identity" && (perm.Attribute == "*" || perm.Attribute == attr) {
			return true
		}
	}
	return false
}

// ErrInvalidScope means a requested scope is malformed, lacks atproto, or
// asks for more than the client declared.
var ErrInvalidScope = errors.New("invalid scope")

// grantableScope checks a requested scope against the client's declared
// scope and returns the scope to grant: the requested tokens in order,
// without duplicates, minus permissions this server does not understand
// (the spec says to ignore them rather than fail). Permission sets
// (include:) are kept as written, at most MaxIncludes distinct ones, and
// only when the server resolves them (sets); they are resolved and
// expanded later (Server.tokenScope).
func grantableScope(requested, declared string, sets bool) (string, error) {
	if requested == "" {
		return "", fmt.Errorf("%w: scope is required", ErrInvalidScope)
	}
	if len(requested) > MaxScopeLen {
		return "", fmt.Errorf("%w: scope longer than %d bytes", ErrInvalidScope, MaxScopeLen)
	}
	toks := strings.Fields(requested)
	if len(toks) > MaxScopeTokens {
		return "", fmt.Errorf("%w: more than %d scope values", ErrInvalidScope, MaxScopeTokens)
	}
	if !slices.Contains(toks, ScopeAtproto) {
		return "", fmt.Errorf("%w: scope must include %q", ErrInvalidScope, ScopeAtproto)
	}
	allowed := strings.Fields(declared)
	var out []string
	var nsids []syntax.NSID
	for _, tok := range toks {
		if !slices.Contains(allowed, tok) {
			return "", fmt.Errorf("%w: %q is not in the client's declared scope", ErrInvalidScope, tok)
		}
		if slices.Contains(out, tok) {
			continue
		}
		switch tok {
		case ScopeAtproto, ScopeGeneric, ScopeChat, ScopeEmail:
			out = append(out, tok)
			continue
		}
		perm, err := auth.ParsePermissionString(tok)
		if err != nil {
			continue
		}
		if perm.Resource == "include" {
			inc, ok := parseInclude(tok)
			if !ok {
				continue
			}
			if !sets {
				return "", fmt.Errorf("%w: permission sets (%s) are not supported by this server", ErrInvalidScope, tok)
			}
			if !slices.Contains(nsids, inc.NSID) {
				nsids = append(nsids, inc.NSID)
			}
			if len(nsids) > MaxIncludes {
				return "", fmt.Errorf("%w: more than %d permission sets", ErrInvalidScope, MaxIncludes)
			}
		}
		out = append(out, tok)
	}
	return strings.Join(out, " "), nil
}

// includesOf returns the include: values of a granted scope.
func includesOf(scope string) []include {
	var out []include
	for _, tok := range strings.Fields(scope) {
		if !strings.HasPrefix(tok, "include") {
			continue
		}
		if inc, ok := parseInclude(tok); ok {
			out = append(out, inc)
		}
	}
	return out
}

// tokenScope is scope with each permission set (include:) replaced by the
// permissions it grants: what an access token allows, and what the token
// endpoint answers as the granted scope, as the reference server does.
// A scope without sets is returned as it is. Errors are *Error values
// (invalid_scope naming the set, or 503 when resolutions are busy).
func (s *Server) tokenScope(ctx context.Context, scope string) (string, error) {
	incs := includesOf(scope)
	if len(incs) == 0 {
		return scope, nil
	}
	if s.sets == nil {
		return "", oauthErr(http.StatusBadRequest, CodeInvalidScope, "permission sets are not supported by this server")
	}
	sets, err := s.sets.getAll(ctx, incs)
	if err != nil {
		return "", err
	}
	var out []string
	add := func(tok string) {
		if !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	for _, tok := range strings.Fields(scope) {
		inc, ok := parseInclude(tok)
		if !ok {
			add(tok)
			continue
		}
		for _, p := range sets[inc.NSID].expand(inc.Aud) {
			add(p)
		}
	}
	joined := strings.Join(out, " ")
	if len(joined) > MaxTokenScopeLen {
		return "", oauthErr(http.StatusBadRequest, CodeInvalidScope, "the permission sets grant more than %d bytes of permissions", MaxTokenScopeLen)
	}
	return joined, nil
}
