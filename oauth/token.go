package oauth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/oauth/dpop"
	"github.com/bulwark-pds/bulwark/ratelimit"
)

// TokenResponse is the token endpoint's answer. The atproto profile wants
// sub and scope always present.
type TokenResponse struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int    `json:"expires_in"`
	RefreshToken string `json:"refresh_token"`
	Scope        string `json:"scope"`
	Sub          string `json:"sub"`
}

// refreshPrefix marks our refresh tokens (opaque to clients).
const refreshPrefix = "ref-"

func (s *Server) handleToken(w http.ResponseWriter, r *http.Request) {
	res, err := s.token(r.Context(), w, r)
	s.answer(w, r, http.StatusOK, res, err)
}

func (s *Server) token(ctx context.Context, w http.ResponseWriter, r *http.Request) (*TokenResponse, error) {
	form, clientID, proof, err := s.readClientPost(w, r, PathToken, ratelimit.PolicyOAuthClientToken)
	if err != nil {
		return nil, err
	}
	switch form.Get("grant_type") {
	case "authorization_code":
		return s.exchangeCode(ctx, form, clientID, proof)
	case "refresh_token":
		return s.refresh(ctx, form, clientID, proof)
	case "":
		return nil, invalidRequest("grant_type is required")
	default:
		return nil, oauthErr(http.StatusBadRequest, CodeUnsupportedGrant, "grant_type must be authorization_code or refresh_token")
	}
}

// checkPKCE compares a code_verifier (RFC 7636: 43-128 characters) with
// the S256 challenge.
func checkPKCE(verifier, challenge string) error {
	if len(verifier) < 43 || len(verifier) > 128 {
		return invalidGrant("code_verifier must be 43 to 128 characters")
	}
	sum := sha256.Sum256([]byte(verifier))
	if subtle.ConstantTimeCompare([]byte(base64.RawURLEncoding.EncodeToString(sum[:])), []byte(challenge)) != 1 {
		return invalidGrant("code_verifier does not match the code_challenge")
	}
	return nil
}

func (s *Server) exchangeCode(ctx context.Context, form url.Values, clientID string, proof *dpop.Proof) (*TokenResponse, error) {
	code := form.Get("code")
	if code == "" || len(code) > 256 {
		return nil, invalidRequest("code is required")
	}
	c, err := s.clients.get(ctx, clientID)
	if err != nil {
		return nil, err
	}
	auth, err := s.authenticateClient(ctx, c, form)
	if err != nil {
		return nil, err
	}
	var res *TokenResponse
	// refused is an answer that still commits: a code is spent by any
	// attempt to exchange it, right or wrong (RFC 6749 section 4.1.2).
	var refused error
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		used, err := useCode(ctx, tx, code)
		if errors.Is(err, db.ErrNotFound) {
			return s.codeReused(ctx, code)
		}
		if err != nil {
			return err
		}
		if refused = checkCodeUse(used, c, auth, proof, form); refused != nil {
			return nil
		}
		acct, err := s.accounts.Get(ctx, used.DID)
		if err != nil {
			if refused = accountGrantError(err); errIsClient(refused) {
				return nil
			}
			return err
		}
		g := &grant{
			ID: "grant-" + randomToken(24), DID: acct.DID, ClientID: c.ID, Scope: used.Params.Scope,
			TokenScope: used.TokenScope, JKT: proof.JKT, ClientAuth: auth, CreatedAt: s.cfg.Now(),
		}
		refresh := refreshPrefix + randomToken(32)
		g.ExpiresAt = s.refreshExpiry(c, g)
		if err := insertGrant(ctx, tx, g, refresh); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, qSetRequestGrant, used.RequestID, g.ID); err != nil {
			return db.Translate(err)
		}
		res, err = s.tokenResponse(g, refresh)
		return err
	})
	if err == nil {
		err = refused
	}
	if err != nil {
		return nil, asError(err)
	}
	return res, nil
}

// checkCodeUse checks that the token request comes from the client, key
// and redirect of the authorization request, with the PKCE verifier.
func checkCodeUse(used *usedCode, c *client, auth clientAuth, proof *dpop.Proof, form url.Values) error {
	switch {
	case used.ClientID != c.ID:
		return invalidGrant("code was issued to another client")
	case form.Get("redirect_uri") != used.Params.RedirectURI:
		return invalidGrant("redirect_uri does not match the authorization request")
	case used.JKT != proof.JKT:
		return invalidGrant("DPoP key does not match the one used for the authorization request")
	case !sameClientKey(used.ClientAuth, auth):
		return invalidGrant("client authentication does not match the authorization request")
	}
	return checkPKCE(form.Get("code_verifier"), used.Params.CodeChallenge)
}

// codeReused handles a code that is unknown, expired or already used. A
// second use revokes what the first produced (the profile's advice: the
// code leaked).
func (s *Server) codeReused(ctx context.Context, code string) error {
	grantID, err := spentGrant(ctx, s.db, qSpentCodeGrant, code)
	if err == nil {
		if _, err := s.db.Exec(ctx, qDeleteGrant, grantID); err != nil {
			return db.Translate(err)
		}
		s.log.Warn("authorization code used twice; grant revoked", "grant", grantID)
		return invalidGrant("code was already used")
	}
	if !errors.Is(err, db.ErrNotFound) {
		return err
	}
	return invalidGrant("code is invalid or expired")
}

// accountGrantError maps Accounts.Get errors at the token endpoint.
func accountGrantError(err error) error {
	if errors.Is(err, ErrAccountUnavailable) || errors.Is(err, db.ErrNotFound) {
		return invalidGrant("the account is not available")
	}
	return err
}

// refreshExpiry is when a refresh token issued now for g stops working:
// public clients' sessions end PublicSessionTTL after they began;
// confidential clients' refresh tokens live ConfidentialRefreshTTL.
func (s *Server) refreshExpiry(c *client, g *grant) time.Time {
	if c.confidential() {
		return s.cfg.Now().Add(s.cfg.ConfidentialRefreshTTL)
	}
	return g.CreatedAt.Add(s.cfg.PublicSessionTTL)
}

func (s *Server) refresh(ctx context.Context, form url.Values, clientID string, proof *dpop.Proof) (*TokenResponse, error) {
	token := form.Get("refresh_token")
	if token == "" || len(token) > 256 {
		return nil, invalidRequest("refresh_token is required")
	}
	c, err := s.clients.get(ctx, clientID)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(c.Metadata.GrantTypes, "refresh_token") {
		return nil, oauthErr(http.StatusBadRequest, CodeUnauthorized, "the client's metadata does not declare the refresh_token grant")
	}
	// Permission sets are resolved before the transaction, which locks
	// the grant: a slow resolution must not hold a connection and a lock.
	refreshed := s.refreshedTokenScope(ctx, token)
	var res *TokenResponse
	var revoke string
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		g, err := grantByRefresh(ctx, tx, token)
		if errors.Is(err, db.ErrNotFound) {
			if id, serr := spentGrant(ctx, tx, qSpentRefreshGrant, token); serr == nil {
				revoke = id
				return invalidGrant("refresh token was already used; the session has been revoked")
			}
			return invalidGrant("refresh token is invalid or expired")
		}
		if err != nil {
			return err
		}
		if g.ClientID != c.ID {
			return invalidGrant("refresh token was issued to another client")
		}
		// Checked before the client's assertion: whoever asks, a session
		// whose key the client withdrew is over (atproto profile).
		if g.ClientAuth.Method == "private_key_jwt" && !keyStillPublished(c, g.ClientAuth) {
			revoke = g.ID
			return invalidGrant("the client no longer publishes the key this session was bound to")
		}
		auth, err := s.authenticateClient(ctx, c, form)
		if err != nil {
			return err
		}
		switch {
		case !s.cfg.Now().Before(g.ExpiresAt):
			return invalidGrant("refresh token has expired")
		case g.JKT != proof.JKT:
			return invalidGrant("DPoP key does not match the session's key")
		case !sameClientKey(g.ClientAuth, auth):
			return invalidGrant("client authentication does not match the session's")
		}
		if _, err := s.accounts.Get(ctx, g.DID); err != nil {
			return accountGrantError(err)
		}
		if refreshed != "" {
			g.TokenScope = refreshed
		}
		next := refreshPrefix + randomToken(32)
		expires := s.refreshExpiry(c, g)
		if err := rotateRefresh(ctx, tx, g, token, next, expires); err != nil {
			return err
		}
		res, err = s.tokenResponse(g, next)
		return err
	})
	if revoke != "" {
		// Outside the failed transaction, which rolled back.
		if _, derr := s.db.Exec(ctx, qDeleteGrant, revoke); derr != nil {
			return nil, serverError(derr)
		}
		s.log.Warn("grant revoked at refresh", "grant", revoke, "reason", err)
	}
	if err != nil {
		return nil, asError(err)
	}
	return res, nil
}

func (s *Server) tokenResponse(g *grant, refresh string) (*TokenResponse, error) {
	access, err := s.signAccessToken(g)
	if err != nil {
		return nil, err
	}
	return &TokenResponse{
		AccessToken:  access,
		TokenType:    "DPoP",
		ExpiresIn:    int(s.cfg.AccessTTL / time.Second),
		RefreshToken: refresh,
		Scope:        g.TokenScope,
		Sub:          string(g.DID),
	}, nil
}

// refreshedTokenScope is what the permission sets of the grant whose
// refresh token is token grant now ("" when it has none, or the token
// names no grant): a refresh picks up a set's newer version, as the
// permission spec intends (the grant stays limited to the sets the person
// allowed, and each set to its own namespace). When the sets cannot be
// resolved, the session goes on with what it had.
func (s *Server) refreshedTokenScope(ctx context.Context, token string) string {
	var id, scope, current string
	err := s.db.QueryRow(ctx, qGrantScopes, hashSecret(token)).Scan(&id, &scope, &current)
	if err != nil || len(includesOf(scope)) == 0 {
		return ""
	}
	next, err := s.tokenScope(ctx, scope)
	if err != nil {
		s.log.Info("permission sets not refreshed; the session keeps its permissions", "grant", id, "err", err)
		return current
	}
	return next
}
