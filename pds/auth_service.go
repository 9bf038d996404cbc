package pds

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/replay"
)

// User service auth: a service-auth JWT of an account hosted here,
// addressed to this server and bound to one of its methods, accepted in
// place of a session. The reference PDS accepts one on uploadBlob (the
// Bluesky app's video service uploads the processed video into the
// user's repository with a token the app got from getServiceAuth) and on
// createAccount (an account moving in; identity_plc.go). Every other
// method refuses such a token, as a session token that does not verify.
//
// The rules: the token is a compact JWS, ES256K or ES256, not an access,
// refresh or DPoP token (typ); iss is an account hosted here, neither
// deactivated nor taken down; aud is exactly this server's service DID;
// lxm is exactly the method called; exp is in the future and at most an
// hour ahead (the longest getServiceAuth issues); jti is present; the
// signature verifies with the account's current signing key. A token is
// accepted once: its jti is remembered until it expires (package replay),
// and given back only if the call it carried failed before anything was
// stored, so that the client may retry.
//
// The key is the one this server holds for the account, not one read
// from its DID document as the reference PDS does: for an account whose
// repository this server signs they are the same key, and reading the
// document would make every forged token cost a PLC or did:web lookup.

// maxServiceJWT bounds the token decoded: a real one is about 400 bytes.
const maxServiceJWT = 4096

// serviceJWT is a decoded, not yet verified, service-auth JWT.
type serviceJWT struct {
	alg, typ     string
	iss, aud     string
	lxm, jti     string
	hasLxm       bool
	exp, iat     float64
	hasExp       bool
	hasIat       bool
	signingInput string
	sig          []byte
}

// decodeServiceJWT decodes a compact JWS's header and claims. ok is false
// when token is not shaped like a service-auth JWT at all (then it is a
// session token, or garbage, for requireAuth to refuse).
func decodeServiceJWT(token string) (j *serviceJWT, ok bool) {
	if len(token) > maxServiceJWT {
		return nil, false
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, false
	}
	var hdr struct {
		Alg string `json:"alg"`
		Typ string `json:"typ"`
	}
	if !decodeSegment(parts[0], &hdr) {
		return nil, false
	}
	var claims map[string]json.RawMessage
	if !decodeSegment(parts[1], &claims) {
		return nil, false
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, false
	}
	j = &serviceJWT{alg: hdr.Alg, typ: hdr.Typ, signingInput: parts[0] + "." + parts[1], sig: sig}
	_, j.hasLxm = claims["lxm"]
	if j.alg != "ES256K" && j.alg != "ES256" && !j.hasLxm {
		return nil, false
	}
	str := func(k string) string {
		var v string
		_ = json.Unmarshal(claims[k], &v)
		return v
	}
	num := func(k string) (float64, bool) {
		var v float64
		if _, ok := claims[k]; !ok || json.Unmarshal(claims[k], &v) != nil {
			return 0, false
		}
		return v, true
	}
	j.iss, j.aud, j.lxm, j.jti = str("iss"), str("aud"), str("lxm"), str("jti")
	j.exp, j.hasExp = num("exp")
	j.iat, j.hasIat = num("iat")
	return j, true
}

func decodeSegment(seg string, v any) bool {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	return err == nil && json.Unmarshal(b, v) == nil
}

// isServiceAuth reports whether the request's bearer token is a
// service-auth JWT rather than a session token: signed with an account
// key (ES256K, ES256) or bound to a method (lxm). Session tokens are
// HS256 and carry no lxm.
func isServiceAuth(r *http.Request) bool {
	token, err := bearerToken(r)
	if err != nil || token == "" {
		return false
	}
	_, ok := decodeServiceJWT(token)
	return ok
}

// spentToken is a service-auth token accepted for a call, to be given
// back (unspend) when the call fails before it stored anything.
type spentToken struct {
	s   *Server
	use replay.Use
}

// unspend forgets the token's use; errors are logged, the token then stays
// spent.
func (t *spentToken) unspend(ctx context.Context) {
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := t.s.replay.Unspend(ctx, t.use); err != nil {
		t.s.logger.Warn("could not give back a service-auth token", "did", t.use.Issuer, "error", err)
	}
}

func serviceAuthErr(name, format string, args ...any) *XRPCError {
	return newError(http.StatusUnauthorized, name, format, args...)
}

// requireUserServiceAuth verifies the request's bearer token as user
// service auth for method lxm (see above) and spends it. The errors are
// 401s named as the reference PDS names them (BadJwt, BadJwtType,
// JwtExpired, BadJwtAudience, BadJwtLexiconMethod, BadJwtIss,
// UntrustedIss, BadJwtSignature), JwtReplayed for a token used before,
// and AccountDeactivated / AccountTakedown for an account that may not
// act. The cheap checks come first: only a token that names an account
// here, for this server and method, costs a query and a signature check.
func (s *Server) requireUserServiceAuth(r *http.Request, lxm string) (*account.Auth, *spentToken, error) {
	token, err := bearerToken(r)
	if err != nil {
		return nil, nil, err
	}
	j, ok := decodeServiceJWT(token)
	if !ok {
		return nil, nil, serviceAuthErr("BadJwt", "the bearer token is not a service-auth JWT")
	}
	did, exp, err := s.checkServiceClaims(j, lxm)
	if err != nil {
		return nil, nil, err
	}
	ctx := r.Context()
	a, err := s.accounts.Get(ctx, did)
	if errors.Is(err, account.ErrAccountNotFound) {
		return nil, nil, serviceAuthErr("UntrustedIss", "the service-auth JWT's issuer %s is not an account on this server", did)
	}
	if err != nil {
		return nil, nil, err
	}
	pub, err := s.accounts.PublicKey(ctx, did)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case !signedBy(j, pub):
		return nil, nil, serviceAuthErr("BadJwtSignature", "the service-auth JWT's signature does not verify with %s's signing key", did)
	case a.Status == account.StatusTakendown:
		return nil, nil, account.ErrAccountTakendown
	case a.Status == account.StatusDeactivated:
		return nil, nil, account.ErrAccountDeactivated
	}
	use := replay.Use{Purpose: lxm, Issuer: did.String(), ID: j.jti, Expires: exp.Add(serviceAuthLeeway)}
	if err := s.replay.Spend(ctx, use); err != nil {
		if errors.Is(err, replay.ErrReplayed) {
			return nil, nil, serviceAuthErr("JwtReplayed", "this service-auth JWT was used already: ask for a new one (com.atproto.server.getServiceAuth)")
		}
		return nil, nil, err
	}
	auth := &account.Auth{DID: a.DID, Handle: a.Handle, Status: a.Status, Scope: "service:" + lxm}
	return auth, &spentToken{s: s, use: use}, nil
}

// checkServiceClaims checks everything about j that needs neither the
// database nor the key, and returns the issuer and the expiry.
func (s *Server) checkServiceClaims(j *serviceJWT, lxm string) (syntax.DID, time.Time, error) {
	now := time.Now()
	switch {
	case j.typ == "at+jwt" || j.typ == "refresh+jwt" || j.typ == "dpop+jwt":
		return "", time.Time{}, serviceAuthErr("BadJwtType", "a %s token is not a service-auth JWT", j.typ)
	case j.alg != "ES256K" && j.alg != "ES256":
		return "", time.Time{}, serviceAuthErr("BadJwt", "service-auth JWTs are signed with ES256K or ES256, not %.20q", j.alg)
	case !j.hasExp || math.IsNaN(j.exp):
		return "", time.Time{}, serviceAuthErr("BadJwt", "the service-auth JWT has no exp")
	}
	exp := time.Unix(int64(min(max(j.exp, 0), 1<<40)), 0)
	switch {
	case now.After(exp.Add(serviceAuthLeeway)):
		return "", time.Time{}, serviceAuthErr("JwtExpired", "the service-auth JWT has expired")
	case exp.After(now.Add(account.ServiceAuthMaxTTL + serviceAuthLeeway)):
		return "", time.Time{}, serviceAuthErr("BadJwt", "the service-auth JWT expires more than %v ahead", account.ServiceAuthMaxTTL)
	case j.hasIat && j.iat > float64(now.Add(serviceAuthLeeway).Unix()):
		return "", time.Time{}, serviceAuthErr("BadJwt", "the service-auth JWT was issued in the future (iat)")
	case j.aud != s.cfg.ServiceDID():
		return "", time.Time{}, serviceAuthErr("BadJwtAudience", "the service-auth JWT is addressed to %.100q, not to this server (%s)", j.aud, s.cfg.ServiceDID())
	case !j.hasLxm:
		return "", time.Time{}, serviceAuthErr("BadJwtLexiconMethod", "the service-auth JWT names no method (lxm): it must be bound to %s", lxm)
	case j.lxm != lxm:
		return "", time.Time{}, serviceAuthErr("BadJwtLexiconMethod", "the service-auth JWT is bound to %.100q, not %s (lxm)", j.lxm, lxm)
	case !replay.ValidID(j.jti):
		return "", time.Time{}, serviceAuthErr("BadJwt", "the service-auth JWT needs a jti of 1 to %d printable characters, so that it can be used once", replay.MaxIDLen)
	}
	did, err := syntax.ParseDID(j.iss)
	if err != nil {
		return "", time.Time{}, serviceAuthErr("BadJwtIss", "the service-auth JWT's iss is not a DID")
	}
	return did, exp, nil
}

// signedBy reports whether j's signature verifies with pub, and j's alg
// is pub's kind of key. Signatures with a high S are accepted, as the
// reference PDS accepts them.
func signedBy(j *serviceJWT, pub atcrypto.PublicKey) bool {
	switch pub.(type) {
	case *atcrypto.PublicKeyK256:
		if j.alg != "ES256K" {
			return false
		}
	case *atcrypto.PublicKeyP256:
		if j.alg != "ES256" {
			return false
		}
	default:
		return false
	}
	return len(j.sig) == 64 && pub.HashAndVerifyLenient([]byte(j.signingInput), j.sig) == nil
}
