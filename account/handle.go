package account

import (
	"context"
	"errors"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Length bounds on the part of a handle before the server's domain, as in
// the reference PDS.
const (
	MinHandleFrontLength = 3
	MaxHandleFrontLength = 18
)

// reservedHandles are names under the server's domains that nobody may
// register: they would impersonate the service or its staff.
var reservedHandles = map[string]bool{}

func init() {
	for _, n := range strings.Fields(`
		abuse about access account accounts admin administrator api app apps atproto
		auth blog bluesky bot bsky bulwark cdn contact dev docs download email feed
		feeds firehose help helpdesk home host hostmaster info invite join legal login
		logout mail mod moderation moderator mods news noc official owner pds plc
		policy postmaster press privacy relay root security service settings signin
		signup staff status support sync system team terms test tos verify webmaster
		www xrpc`) {
		reservedHandles[n] = true
	}
}

// NormalizeHandle parses raw, lower-cases it, and checks the rules for a
// handle hosted here: under one of the server's handle domains, the part
// before the domain 3–18 characters without dots, and not reserved.
func (s *Service) NormalizeHandle(raw string) (syntax.Handle, error) {
	return s.normalizeHandle(raw, false)
}

// normalizeHandle is NormalizeHandle; anyValid lets a reserved name
// through.
func (s *Service) normalizeHandle(raw string, anyValid bool) (syntax.Handle, error) {
	h, err := syntax.ParseHandle(strings.TrimSpace(raw))
	if err != nil {
		return "", ruleErr(ErrInvalidHandle, "invalid handle %q: %v", raw, err)
	}
	h = h.Normalize()
	var front string
	for _, d := range s.cfg.HandleDomains {
		if f, ok := strings.CutSuffix(h.String(), d); ok && f != "" {
			front = f
			break
		}
	}
	switch {
	case front == "":
		return "", ruleErr(ErrUnsupportedDomain, "handle %s is not under this server's domains (%s)", h, strings.Join(s.cfg.HandleDomains, ", "))
	case strings.Contains(front, "."):
		return "", ruleErr(ErrInvalidHandle, "handle %s: the name before %s must not contain dots", h, strings.TrimPrefix(h.String(), front))
	case len(front) < MinHandleFrontLength:
		return "", ruleErr(ErrInvalidHandle, "handle %s is too short: use at least %d characters before the domain", h, MinHandleFrontLength)
	case len(front) > MaxHandleFrontLength:
		return "", ruleErr(ErrInvalidHandle, "handle %s is too long: use at most %d characters before the domain", h, MaxHandleFrontLength)
	case reservedHandles[front] && !anyValid:
		return "", ruleErr(ErrHandleNotAvailable, "handle %s is reserved", h)
	}
	return h, nil
}

// IsHostedHandle reports whether h is under one of the server's handle
// domains (whether or not an account has it).
func (s *Service) IsHostedHandle(h syntax.Handle) bool {
	for _, d := range s.cfg.HandleDomains {
		if strings.HasSuffix(h.Normalize().String(), d) {
			return true
		}
	}
	return false
}

// HandleResolver finds the DID a handle names, by DNS TXT
// (_atproto.<handle>) then https://<handle>/.well-known/atproto-did, as
// package outbound's Client does through its guard. It must not cache: a
// handle is checked as it resolves at the time of the change.
type HandleResolver interface {
	ResolveHandle(ctx context.Context, h syntax.Handle) (syntax.DID, error)
}

// ErrHandleNotResolved means a handle outside the server's domains does not
// resolve to the account's DID (the reference PDS's "External handle did
// not resolve to DID").
var ErrHandleNotResolved = errors.New("external handle did not resolve to DID")

// CheckHandle is NormalizeHandle for the handle did asks for: a name under
// the server's domains follows the same rules; any other name (a domain of
// the user's own) must have a top-level domain handles may use
// (ErrInvalidHandle) and resolve, through resolve and at the time of the
// call, to did (ErrHandleNotResolved). Without a resolver only the
// server's domains are accepted (ErrUnsupportedDomain).
func (s *Service) CheckHandle(ctx context.Context, raw string, did syntax.DID, resolve HandleResolver) (syntax.Handle, error) {
	return s.checkHandle(ctx, raw, did, resolve, false)
}

// checkHandle is CheckHandle; anyValid lets a reserved name under the
// server's domains through.
func (s *Service) checkHandle(ctx context.Context, raw string, did syntax.DID, resolve HandleResolver, anyValid bool) (syntax.Handle, error) {
	h, err := syntax.ParseHandle(strings.TrimSpace(raw))
	if err != nil || resolve == nil || s.IsHostedHandle(h) {
		return s.normalizeHandle(raw, anyValid)
	}
	h = h.Normalize()
	if !h.AllowedTLD() || h.IsInvalidHandle() {
		return "", ruleErr(ErrInvalidHandle, "handle %s: its top-level domain is reserved and cannot be resolved", h)
	}
	got, err := resolve.ResolveHandle(ctx, h)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		s.log.Debug("handle not resolved", "handle", h, "did", did, "error", err)
		return "", ruleErr(ErrHandleNotResolved, "External handle did not resolve to DID: %s has no _atproto TXT record or /.well-known/atproto-did naming %s", h, did)
	}
	if got != did {
		return "", ruleErr(ErrHandleNotResolved, "External handle did not resolve to DID: %s names another DID, not %s", h, did)
	}
	return h, nil
}
