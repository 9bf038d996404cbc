package oauth

import (
	"context"
	"slices"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
)

// Silent re-authorization (prompt=none, OpenID Connect Core 3.1.2.1): no
// page is shown; the browser goes straight back to the app with a code
// when the app already holds a live grant, for an account signed in on
// this browser, that covers every scope value it asks for now; otherwise
// with an error:
//
//   - consent_required: the app is public and not trusted by the
//     operator (Config.TrustedClients), so anyone could be using its
//     client_id and silent sign-in is never offered, as in the reference
//     server; or an account signed in here has granted the app less than
//     it asks for;
//   - account_selection_required: several accounts signed in here have
//     granted the app what it asks for, and no login_hint says which;
//   - login_required: no account signed in on this browser (that matches
//     the login_hint) has a live grant for the app.
//
// An app learns nothing about accounts that have not granted it anything:
// for it, a browser where they are signed in answers exactly as one where
// no one is (login_required), hint or no hint.

// Errors of silent authorization (OpenID Connect Core 3.1.2.6).
const (
	CodeLoginRequired            = "login_required"
	CodeConsentRequired          = "consent_required"
	CodeAccountSelectionRequired = "account_selection_required"
)

// maxSilentGrants bounds the grants looked at for one silent request.
const maxSilentGrants = 400

// silentAuthorize answers a prompt=none request.
func (s *Server) silentAuthorize(f *flow) {
	if !f.c.confidential() && !slices.Contains(s.cfg.TrustedClients, f.c.ID) {
		s.refuseToClient(f, CodeConsentRequired, "this app cannot sign in without showing the consent page")
		return
	}
	ctx := f.r.Context()
	accounts, err := s.signedIn(ctx, f.d)
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	var candidates []Account
	for _, a := range accounts {
		if matchesHint(a, f.req.Params.LoginHint) {
			candidates = append(candidates, a)
		}
	}
	granted, covering, err := s.clientGrants(ctx, candidates, f.c.ID, f.req.Params.Scope)
	if err != nil {
		s.showPageError(f.w, internalPageError(err))
		return
	}
	switch {
	case len(covering) == 1:
		s.approve(f, covering[0], "authorization approved silently")
	case len(covering) > 1:
		s.refuseToClient(f, CodeAccountSelectionRequired, "several accounts signed in here could be used")
	case len(granted) > 0:
		s.refuseToClient(f, CodeConsentRequired, "the app asks for more than it was allowed")
	default:
		s.refuseToClient(f, CodeLoginRequired, "no account is signed in for this app")
	}
}

// clientGrants returns the accounts among candidates for which the client
// holds a live grant (granted), and those of them where one grant covers
// every value of scope (covering).
func (s *Server) clientGrants(ctx context.Context, candidates []Account, clientID, scope string) (granted, covering []Account, err error) {
	if len(candidates) == 0 {
		return nil, nil, nil
	}
	dids := make([]string, len(candidates))
	for i, a := range candidates {
		dids[i] = string(a.DID)
	}
	rows, err := s.db.Query(ctx, qClientGrantScopes, dids, clientID, maxSilentGrants)
	if err != nil {
		return nil, nil, db.Translate(err)
	}
	defer rows.Close()
	has := map[syntax.DID]bool{}
	covers := map[syntax.DID]bool{}
	want := strings.Fields(scope)
	for rows.Next() {
		var did, grantScope string
		if err := rows.Scan(&did, &grantScope); err != nil {
			return nil, nil, db.Translate(err)
		}
		has[syntax.DID(did)] = true
		have := strings.Fields(grantScope)
		if !slices.ContainsFunc(want, func(tok string) bool { return !slices.Contains(have, tok) }) {
			covers[syntax.DID(did)] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, db.Translate(err)
	}
	for _, a := range candidates {
		if has[a.DID] {
			granted = append(granted, a)
		}
		if covers[a.DID] {
			covering = append(covering, a)
		}
	}
	return granted, covering, nil
}
