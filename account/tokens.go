package account

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"
)

// Session token scopes, as the reference PDS names them.
const (
	// ScopeAccess is a full session (logged in with the account password).
	ScopeAccess = "com.atproto.access"
	// ScopeAppPass is a session from an ordinary app password.
	ScopeAppPass = "com.atproto.appPass"
	// ScopeAppPassPrivileged is a session from a privileged app password
	// (may also use DMs in the reference PDS).
	ScopeAppPassPrivileged = "com.atproto.appPassPrivileged"
	// ScopeRefresh is the scope of every refresh token.
	ScopeRefresh = "com.atproto.refresh"
	// ScopeTakendown is a session a taken-down account opened to move
	// away (createSession with allowTakendown): it reaches only the
	// methods that export the account or move it, and is never refreshed.
	ScopeTakendown = "com.atproto.takendown"
)

// Token lifetimes, as in the reference PDS.
const (
	AccessTokenTTL  = 2 * time.Hour
	RefreshTokenTTL = 90 * 24 * time.Hour
)

// JWT header types (RFC 9068 for access tokens).
const (
	typAccess  = "at+jwt"
	typRefresh = "refresh+jwt"
)

// tokenClaims are the claims of Bulwark's session tokens. Lxm and Cnf are
// never set here: they are read so that a service-auth or
// proof-of-possession token is refused, as the reference PDS does.
//
// Aud is a single string, as the reference PDS writes it (jwt's
// ClaimStrings would marshal an array, which the reference refuses); it
// shadows RegisteredClaims.Audience, and GetAudience serves it to the
// validator.
type tokenClaims struct {
	Scope string `json:"scope"`
	Aud   string `json:"aud"`
	Lxm   any    `json:"lxm,omitempty"`
	Cnf   any    `json:"cnf,omitempty"`
	jwt.RegisteredClaims
}

// GetAudience implements jwt.Claims for the single-string aud.
func (c tokenClaims) GetAudience() (jwt.ClaimStrings, error) {
	if c.Aud == "" {
		return nil, nil
	}
	return jwt.ClaimStrings{c.Aud}, nil
}

// Claims are the verified contents of a session token.
type Claims struct {
	DID   syntax.DID
	Scope string
	// ID is the token's jti: for an access token the session id, for a
	// refresh token the refresh token's own id.
	ID        string
	ExpiresAt time.Time
}

// Session is a pair of tokens handed to a client.
type Session struct {
	AccessJwt  string
	RefreshJwt string
	Scope      string
	SessionID  string
}

// signer issues and verifies session JWTs.
type signer struct {
	secret     []byte
	audience   string
	accessTTL  time.Duration
	refreshTTL time.Duration
	now        func() time.Time

	// verified remembers tokens whose signature and claims checked out,
	// so a client sending the same access token with every request pays
	// for the HMAC and the JSON decoding (~40 µs) once. Expiry and scope
	// are still checked on every use; revocation is checked by the caller
	// against the database, as before.
	verifiedMu sync.Mutex
	verified   map[verifiedKey]*Claims
}

type verifiedKey struct{ token, typ string }

// maxVerified bounds the remembered tokens (about 400 bytes each); when
// full, the set starts again empty.
const maxVerified = 8192

func randomID() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *signer) sign(typ string, c tokenClaims) (string, error) {
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, c)
	t.Header["typ"] = typ
	return t.SignedString(s.secret)
}

// issue makes an access token for session sid and a refresh token with id
// jti; it returns the refresh token's expiry too.
func (s *signer) issue(did syntax.DID, scope, sid, jti string) (*Session, time.Time, error) {
	exp := s.now().Add(s.refreshTTL)
	sess, err := s.issueWithExpiry(did, scope, sid, jti, exp)
	return sess, exp, err
}

// issueWithExpiry is issue with the refresh token's expiry given.
func (s *signer) issueWithExpiry(did syntax.DID, scope, sid, jti string, refreshExp time.Time) (*Session, error) {
	now := s.now()
	access, err := s.sign(typAccess, tokenClaims{Scope: scope, Aud: s.audience, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   did.String(),
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(s.accessTTL)),
		ID:        sid,
	}})
	if err != nil {
		return nil, err
	}
	refresh, err := s.sign(typRefresh, tokenClaims{Scope: ScopeRefresh, Aud: s.audience, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   did.String(),
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(refreshExp),
		ID:        jti,
	}})
	if err != nil {
		return nil, err
	}
	return &Session{AccessJwt: access, RefreshJwt: refresh, Scope: scope, SessionID: sid}, nil
}

// parse verifies a token of the given JWT type and returns its claims.
// Errors are ErrExpiredToken or ErrInvalidToken, with a reason.
func (s *signer) parse(token, typ string, scopes ...string) (*Claims, error) {
	key := verifiedKey{token, typ}
	s.verifiedMu.Lock()
	cached := s.verified[key]
	s.verifiedMu.Unlock()
	if cached != nil {
		if !s.now().Before(cached.ExpiresAt) {
			return nil, ruleErr(ErrExpiredToken, "token has expired")
		}
		if err := checkScope(cached.Scope, scopes); err != nil {
			return nil, err
		}
		c := *cached
		return &c, nil
	}
	c, err := s.verify(token, typ, scopes...)
	if err != nil {
		return nil, err
	}
	s.verifiedMu.Lock()
	if s.verified == nil || len(s.verified) >= maxVerified {
		s.verified = make(map[verifiedKey]*Claims)
	}
	v := *c
	s.verified[key] = &v
	s.verifiedMu.Unlock()
	return c, nil
}

// verify checks token's signature, type, audience, expiry and scope.
func (s *signer) verify(token, typ string, scopes ...string) (*Claims, error) {
	var c tokenClaims
	_, err := jwt.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		if got, _ := t.Header["typ"].(string); got != typ {
			return nil, fmt.Errorf("token type is %q, not %q", got, typ)
		}
		return s.secret, nil
	},
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithAudience(s.audience),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(s.now),
	)
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, ruleErr(ErrExpiredToken, "token has expired")
	case err != nil:
		return nil, ruleErr(ErrInvalidToken, "token could not be verified")
	case c.Lxm != nil || c.Cnf != nil:
		return nil, ruleErr(ErrInvalidToken, "malformed token")
	}
	did, err := syntax.ParseDID(c.Subject)
	if err != nil {
		return nil, ruleErr(ErrInvalidToken, "malformed token")
	}
	if err := checkScope(c.Scope, scopes); err != nil {
		return nil, err
	}
	if c.ID == "" {
		return nil, ruleErr(ErrInvalidToken, "token has no id")
	}
	return &Claims{DID: did, Scope: c.Scope, ID: c.ID, ExpiresAt: c.ExpiresAt.Time}, nil
}

// checkScope refuses a token whose scope is not one of scopes.
func checkScope(scope string, scopes []string) error {
	if !slices.Contains(scopes, scope) {
		return ruleErr(ErrInvalidToken, "bad token scope")
	}
	return nil
}
