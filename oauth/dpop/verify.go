package dpop

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Limits on what a client sends.
const (
	// MaxProofLen bounds the DPoP header: an ES256 proof with its JWK is
	// well under 1 KiB.
	MaxProofLen = 4096
	// MaxJTILen bounds the proof id remembered for replay detection.
	MaxJTILen = 256
	// HeaderType is the required "typ" of a proof.
	HeaderType = "dpop+jwt"
)

// Sentinel errors. The oauth package maps each to its OAuth error code.
var (
	// ErrInvalidProof means the proof is malformed, badly signed, or does
	// not match the request (invalid_dpop_proof).
	ErrInvalidProof = errors.New("invalid DPoP proof")
	// ErrUseNonce means the proof carries no nonce, or one this server no
	// longer accepts; the client should retry with the current nonce
	// (use_dpop_nonce).
	ErrUseNonce = errors.New("DPoP nonce required")
	// ErrReplay means a proof with this id was already used.
	ErrReplay = errors.New("DPoP proof replayed")
)

// Request is what a proof must match.
type Request struct {
	// Method is the HTTP method (htm).
	Method string
	// URL is the request URL as the client addressed it, without query or
	// fragment (htu); see NormalizeHTU.
	URL string
	// AccessToken, when set, must be bound by the proof's "ath" claim
	// (requests to the resource server).
	AccessToken string
}

// Proof is a verified proof.
type Proof struct {
	// JKT is the RFC 7638 SHA-256 thumbprint of the proof key, base64url.
	JKT string
	// JTI is the proof's unique id.
	JTI string
	// IssuedAt is the proof's iat.
	IssuedAt time.Time
}

type claims struct {
	JTI   string   `json:"jti"`
	HTM   string   `json:"htm"`
	HTU   string   `json:"htu"`
	IAT   *float64 `json:"iat"`
	Exp   *float64 `json:"exp"`
	Nonce *string  `json:"nonce"`
	ATH   *string  `json:"ath"`
}

// Verify checks a proof against req: signature (ES256, key in the header),
// typ, htm, htu, iat window, nonce, ath, and finally that its jti is new.
// A proof that fails any earlier check is not remembered, so a client's
// retry after ErrUseNonce is not mistaken for a replay.
func (v *Verifier) Verify(proof string, req Request) (*Proof, error) {
	if proof == "" {
		return nil, fmt.Errorf("%w: missing DPoP header", ErrInvalidProof)
	}
	if len(proof) > MaxProofLen {
		return nil, fmt.Errorf("%w: proof longer than %d bytes", ErrInvalidProof, MaxProofLen)
	}
	key, payload, err := parseProof(proof)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidProof, err)
	}
	var c claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return nil, fmt.Errorf("%w: claims: %v", ErrInvalidProof, err)
	}
	iat, err := v.checkClaims(&c, req)
	if err != nil {
		return nil, err
	}
	jkt, err := Thumbprint(&jose.JSONWebKey{Key: key})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidProof, err)
	}
	if !v.replay.add(jkt, c.JTI, v.now()) {
		return nil, fmt.Errorf("%w: jti already used", ErrReplay)
	}
	return &Proof{JKT: jkt, JTI: c.JTI, IssuedAt: iat}, nil
}

func (v *Verifier) checkClaims(c *claims, req Request) (time.Time, error) {
	if c.JTI == "" || len(c.JTI) > MaxJTILen {
		return time.Time{}, fmt.Errorf("%w: jti must be 1-%d characters", ErrInvalidProof, MaxJTILen)
	}
	if c.HTM != req.Method {
		return time.Time{}, fmt.Errorf("%w: htm does not match the request method", ErrInvalidProof)
	}
	htu, err := NormalizeHTU(c.HTU)
	if err != nil || htu != req.URL {
		return time.Time{}, fmt.Errorf("%w: htu does not match the request URL", ErrInvalidProof)
	}
	now := v.now()
	if c.IAT == nil {
		return time.Time{}, fmt.Errorf("%w: iat is required", ErrInvalidProof)
	}
	iat := time.Unix(int64(*c.IAT), 0)
	if iat.Before(now.Add(-v.cfg.MaxAge)) || iat.After(now.Add(v.cfg.Leeway)) {
		return time.Time{}, fmt.Errorf("%w: iat is outside the accepted window", ErrInvalidProof)
	}
	if c.Exp != nil && time.Unix(int64(*c.Exp), 0).Before(now.Add(-v.cfg.Leeway)) {
		return time.Time{}, fmt.Errorf("%w: proof has expired", ErrInvalidProof)
	}
	if req.AccessToken != "" {
		want := hashB64(req.AccessToken)
		if c.ATH == nil || subtle.ConstantTimeCompare([]byte(*c.ATH), []byte(want)) != 1 {
			return time.Time{}, fmt.Errorf("%w: ath does not match the access token", ErrInvalidProof)
		}
	}
	if c.Nonce == nil || *c.Nonce == "" {
		return time.Time{}, fmt.Errorf("%w: proof has no nonce", ErrUseNonce)
	}
	if !v.nonceValid(*c.Nonce, now) {
		return time.Time{}, fmt.Errorf("%w: nonce is stale or unknown", ErrUseNonce)
	}
	return iat, nil
}

// Thumbprint is the RFC 7638 SHA-256 thumbprint of a public key, base64url
// without padding: the "jkt" tokens are bound to.
func Thumbprint(key *jose.JSONWebKey) (string, error) {
	tp, err := key.Thumbprint(crypto.SHA256)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(tp), nil
}

// AccessTokenHash is the "ath" value for an access token.
func AccessTokenHash(token string) string { return hashB64(token) }

func hashB64(s string) string {
	h := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// NormalizeHTU reduces a URL to the form htu is compared in (RFC 9449
// section 4.3): scheme and host lower case, default port dropped, query and
// fragment removed, path kept as sent.
func NormalizeHTU(raw string) (string, error) {
	if len(raw) > 2048 {
		return "", errors.New("htu too long")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "https" && u.Scheme != "http" || u.Host == "" || u.User != nil {
		return "", errors.New("htu must be an absolute http(s) URL")
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port := u.Port(); port != "" && !(scheme == "https" && port == "443") && !(scheme == "http" && port == "80") {
		host += ":" + port
	}
	path := u.EscapedPath()
	if path == "" {
		path = "/"
	}
	return scheme + "://" + host + path, nil
}
