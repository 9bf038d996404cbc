package oauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/oauth/dpop"
)

// Access tokens are HS256 JWTs (RFC 9068 "at+jwt") keyed by a key derived
// from Config.Secret. The same process issues and checks them, so nothing
// is gained from a public-key signature; the reference PDS does the same
// with its JWT secret.
const accessTokenType = "at+jwt"

// maxAccessTokenLen bounds the Authorization header we parse.
const maxAccessTokenLen = 4096

type accessClaims struct {
	jwt.Claims
	ClientID string `json:"client_id"`
	// The token carries no scope: what it allows is its grant's (read on
	// every use), which also keeps it short whatever the grant holds.
	// GrantID names the grant (session) the token belongs to.
	GrantID string `json:"sid"`
	Cnf     struct {
		JKT string `json:"jkt"`
	} `json:"cnf"`
}

func (s *Server) signAccessToken(g *grant) (string, error) {
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: s.tokenKey},
		(&jose.SignerOptions{}).WithType(accessTokenType))
	if err != nil {
		return "", err
	}
	now := s.cfg.Now()
	c := accessClaims{
		Claims: jwt.Claims{
			Issuer:   s.cfg.Issuer,
			Subject:  string(g.DID),
			Audience: jwt.Audience{s.cfg.Issuer},
			IssuedAt: jwt.NewNumericDate(now),
			Expiry:   jwt.NewNumericDate(now.Add(s.cfg.AccessTTL)),
			ID:       randomToken(16),
		},
		ClientID: g.ClientID,
		GrantID:  g.ID,
	}
	c.Cnf.JKT = g.JKT
	return jwt.Signed(signer).Claims(c).Serialize()
}

// parseAccessToken verifies an access token's signature, type and issuer.
// Expiry is checked unless allowExpired (revocation accepts old tokens).
func (s *Server) parseAccessToken(token string, allowExpired bool) (*accessClaims, error) {
	if len(token) > maxAccessTokenLen {
		return nil, errors.New("token too long")
	}
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.HS256})
	if err != nil {
		return nil, err
	}
	if len(tok.Headers) != 1 || tok.Headers[0].ExtraHeaders[jose.HeaderType] != accessTokenType {
		return nil, errors.New("not an access token")
	}
	var c accessClaims
	if err := tok.Claims(s.tokenKey, &c); err != nil {
		return nil, err
	}
	exp := jwt.Expected{Issuer: s.cfg.Issuer, AnyAudience: jwt.Audience{s.cfg.Issuer}, Time: s.cfg.Now()}
	if allowExpired {
		exp.Time = time.Time{}
		if c.Expiry != nil {
			exp.Time = c.Expiry.Time().Add(-time.Second)
		}
	}
	if err := c.ValidateWithLeeway(exp, 0); err != nil {
		return nil, err
	}
	if c.GrantID == "" || c.Cnf.JKT == "" {
		return nil, errors.New("token lacks its grant or key binding")
	}
	return &c, nil
}

// AccessInfo is a verified OAuth access: who, which client, and what it
// may do (the embedded Permissions).
type AccessInfo struct {
	*Permissions
	// DID is the account.
	DID syntax.DID
	// ClientID is the client the token was issued to.
	ClientID string
	// GrantID names the grant (for logs and revocation).
	GrantID string
	// ExpiresAt is when the access token expires.
	ExpiresAt time.Time
}

// AuthError is why Authenticate refused a request: the status and the
// WWW-Authenticate challenge to send (RFC 6750 / RFC 9449).
type AuthError struct {
	Status int
	// Code is the error code (invalid_token, invalid_dpop_proof,
	// use_dpop_nonce, invalid_request).
	Code        string
	Description string
	cause       error
}

func (e *AuthError) Error() string {
	if e.cause != nil {
		return e.Code + ": " + e.Description + ": " + e.cause.Error()
	}
	return e.Code + ": " + e.Description
}

func (e *AuthError) Unwrap() error { return e.cause }

// WWWAuthenticate is the challenge header value.
func (e *AuthError) WWWAuthenticate() string {
	desc := strings.NewReplacer(`"`, `'`, `\`, `/`).Replace(e.Description)
	return fmt.Sprintf(`DPoP algs="ES256", error=%q, error_description=%q`, e.Code, desc)
}

// ErrNotOAuth means the request carries no DPoP authorization at all: the
// integrator should try its other schemes (or none).
var ErrNotOAuth = errors.New("no DPoP authorization")

func authErr(status int, code, desc string, cause error) *AuthError {
	return &AuthError{Status: status, Code: code, Description: desc, cause: cause}
}

// Authenticate verifies an OAuth request to the resource server:
// "Authorization: DPoP <token>" plus a DPoP proof for this method and URL
// (htu = Issuer + path), bound to the token (ath) and its key (cnf.jkt),
// with a current nonce. It also checks that the grant still exists, so a
// revoked session stops at once, and takes the permissions from it (the
// grant's scope with its permission sets expanded, as of the last token
// issued). Errors are ErrNotOAuth (no DPoP
// Authorization header), an *AuthError (send it with WriteAuthError) or a
// database failure.
func (s *Server) Authenticate(r *http.Request) (*AccessInfo, error) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "DPoP") {
		return nil, ErrNotOAuth
	}
	token = strings.TrimSpace(token)
	claims, err := s.parseAccessToken(token, false)
	if err != nil {
		return nil, authErr(http.StatusUnauthorized, CodeInvalidToken, "access token is invalid or expired", err)
	}
	if len(r.Header.Values("DPoP")) != 1 {
		return nil, authErr(http.StatusUnauthorized, CodeInvalidDPoP, "exactly one DPoP proof is required", nil)
	}
	proof, err := s.dpop.Verify(r.Header.Get("DPoP"), dpop.Request{Method: r.Method, URL: s.cfg.Issuer + r.URL.EscapedPath(), AccessToken: token})
	if errors.Is(err, dpop.ErrUseNonce) {
		return nil, authErr(http.StatusUnauthorized, CodeUseDPoPNonce, "Resource server requires nonce in DPoP proof", err)
	}
	if err != nil {
		return nil, authErr(http.StatusUnauthorized, CodeInvalidDPoP, "DPoP proof is invalid", err)
	}
	if proof.JKT != claims.Cnf.JKT {
		return nil, authErr(http.StatusUnauthorized, CodeInvalidToken, "access token is bound to another DPoP key", nil)
	}
	var did, clientID, scope string
	err = s.db.QueryRow(r.Context(), qActiveGrant, claims.GrantID).Scan(&did, &clientID, &scope)
	if errors.Is(db.Translate(err), db.ErrNotFound) {
		return nil, authErr(http.StatusUnauthorized, CodeInvalidToken, "the session has been revoked", nil)
	}
	if err != nil {
		return nil, fmt.Errorf("oauth: grant lookup: %w", db.Translate(err))
	}
	if did != claims.Subject || clientID != claims.ClientID {
		return nil, authErr(http.StatusUnauthorized, CodeInvalidToken, "access token does not match its session", nil)
	}
	return &AccessInfo{
		Permissions: ParsePermissions(scope),
		DID:         syntax.DID(did),
		ClientID:    clientID,
		GrantID:     claims.GrantID,
		ExpiresAt:   claims.Expiry.Time(),
	}, nil
}

// WriteAuthError answers a request Authenticate refused: the status, the
// WWW-Authenticate challenge, a fresh DPoP-Nonce, and a JSON body in the
// XRPC error shape ({"error","message"}). Other errors become a 500.
func (s *Server) WriteAuthError(w http.ResponseWriter, err error) {
	var ae *AuthError
	if !errors.As(err, &ae) {
		s.log.Error("oauth authentication failed", "err", err)
		ae = authErr(http.StatusInternalServerError, "InternalServerError", "internal error", err)
	} else {
		w.Header().Set("WWW-Authenticate", ae.WWWAuthenticate())
	}
	w.Header().Set("DPoP-Nonce", s.dpop.Nonce())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.Status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": ae.Code, "message": ae.Description})
}
