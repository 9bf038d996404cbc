package oauth

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// handleRevoke is the revocation endpoint (RFC 7009). Revoking either
// token ends the whole grant. Unknown tokens are not an error: the
// outcome the client wants (the token no longer works) holds.
func (s *Server) handleRevoke(w http.ResponseWriter, r *http.Request) {
	err := s.revoke(r.Context(), w, r)
	s.answer(w, r, http.StatusOK, struct{}{}, err)
}

func (s *Server) revoke(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	form, err := readForm(w, r)
	if err != nil {
		return err
	}
	// A DPoP proof is optional here (RFC 7009 predates DPoP), but one that
	// is sent must be valid: a client following the nonce dance gets the
	// usual use_dpop_nonce answer.
	if r.Header.Get("DPoP") != "" {
		if _, err := s.verifyDPoP(r, PathRevoke, ""); err != nil {
			return err
		}
	}
	clientID, err := s.formClientID(w, form, ratelimit.PolicyOAuthClientToken)
	if err != nil {
		return err
	}
	token := form.Get("token")
	if token == "" {
		return invalidRequest("token is required")
	}
	c, err := s.clients.get(ctx, clientID)
	if err != nil {
		return err
	}
	if _, err := s.authenticateClient(ctx, c, form); err != nil {
		return err
	}
	var grantID string
	if strings.HasPrefix(token, refreshPrefix) {
		err := s.db.QueryRow(ctx, qGrantIDByRefresh, hashSecret(token), c.ID).Scan(&grantID)
		if err != nil && !errors.Is(db.Translate(err), db.ErrNotFound) {
			return serverError(err)
		}
	} else if claims, err := s.parseAccessToken(token, true); err == nil && claims.ClientID == c.ID {
		grantID = claims.GrantID
	}
	if grantID == "" {
		return nil
	}
	if _, err := s.db.Exec(ctx, qDeleteGrantOfClient, grantID, c.ID); err != nil {
		return serverError(err)
	}
	return nil
}

// Grant is a grant as the account page shows it.
type Grant struct {
	ID       string
	DID      syntax.DID
	ClientID string
	// Scope is what the person allowed, as the app asked for it;
	// Permissions is that with its permission sets expanded (what the
	// app's tokens allow).
	Scope       string
	Permissions string
	CreatedAt   time.Time
	// LastUsed is when the client last refreshed its tokens.
	LastUsed  time.Time
	ExpiresAt time.Time
}

// maxListedGrants bounds ListGrants.
const maxListedGrants = 200

// ListGrants returns the account's active grants, newest first.
func (s *Server) ListGrants(ctx context.Context, did syntax.DID) ([]Grant, error) {
	rows, err := listGrants(ctx, s.db, did, maxListedGrants)
	if err != nil {
		return nil, err
	}
	out := make([]Grant, 0, len(rows))
	for _, g := range rows {
		out = append(out, Grant{
			ID: g.ID, DID: g.DID, ClientID: g.ClientID, Scope: g.Scope, Permissions: g.TokenScope,
			CreatedAt: g.CreatedAt, LastUsed: g.RefreshedAt, ExpiresAt: g.ExpiresAt,
		})
	}
	return out, nil
}

// ErrGrantNotFound means the account has no grant with that id.
var ErrGrantNotFound = errors.New("grant not found")

// RevokeGrant ends one of the account's grants: its refresh token and
// every access token issued under it stop working at once.
func (s *Server) RevokeGrant(ctx context.Context, did syntax.DID, id string) error {
	if !opaqueID(id) {
		return ErrGrantNotFound
	}
	var got string
	err := db.Translate(s.db.QueryRow(ctx, qDeleteGrantOfDID, id, string(did)).Scan(&got))
	if errors.Is(err, db.ErrNotFound) {
		return ErrGrantNotFound
	}
	return err
}

// RevokeAllGrants ends every grant of the account (for a takedown, a
// password reset, or "sign out everywhere"). q may be the caller's
// transaction.
func RevokeAllGrants(ctx context.Context, q db.DBTX, did syntax.DID) error {
	_, err := q.Exec(ctx, qDeleteGrantsOfDID, string(did))
	return db.Translate(err)
}
