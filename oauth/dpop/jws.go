package dpop

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// proofHeader is the protected header of a proof.
type proofHeader struct {
	Typ  string          `json:"typ"`
	Alg  string          `json:"alg"`
	JWK  *proofJWK       `json:"jwk"`
	Crit json.RawMessage `json:"crit"`
}

type proofJWK struct {
	Kty string  `json:"kty"`
	Crv string  `json:"crv"`
	X   string  `json:"x"`
	Y   string  `json:"y"`
	D   *string `json:"d"`
}

// parseProof verifies a compact ES256 JWS whose key is in its header and
// returns the key and the payload.
//
// It is written out rather than left to go-jose because go-jose (rightly,
// by RFC 7518) refuses EC coordinates shorter than 32 bytes, and indigo's
// client writes P-256 coordinates without their leading zero bytes: about
// one key in 128 would fail every proof. A short coordinate is padded
// here; the point must still lie on the curve.
func parseProof(proof string) (*ecdsa.PublicKey, []byte, error) {
	parts := strings.Split(proof, ".")
	if len(parts) != 3 {
		return nil, nil, errors.New("not a compact JWS")
	}
	hb, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return nil, nil, errors.New("header is not base64url")
	}
	var h proofHeader
	if err := json.Unmarshal(hb, &h); err != nil {
		return nil, nil, errors.New("header is not JSON")
	}
	if h.Typ != HeaderType {
		return nil, nil, fmt.Errorf("typ must be %q", HeaderType)
	}
	if h.Alg != "ES256" {
		return nil, nil, errors.New("alg must be ES256")
	}
	if h.Crit != nil {
		return nil, nil, errors.New("crit header not supported")
	}
	if h.JWK == nil || h.JWK.Kty != "EC" || h.JWK.Crv != "P-256" || h.JWK.D != nil {
		return nil, nil, errors.New("header needs a public P-256 jwk")
	}
	key, err := p256Key(h.JWK.X, h.JWK.Y)
	if err != nil {
		return nil, nil, err
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return nil, nil, errors.New("signature is not a 64-byte ES256 signature")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(key, digest[:], r, s) {
		return nil, nil, errors.New("signature does not verify")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, nil, errors.New("payload is not base64url")
	}
	return key, payload, nil
}

// p256Key builds a P-256 public key from base64url coordinates, padding
// short ones.
func p256Key(xs, ys string) (*ecdsa.PublicKey, error) {
	x, err1 := base64.RawURLEncoding.DecodeString(xs)
	y, err2 := base64.RawURLEncoding.DecodeString(ys)
	if err1 != nil || err2 != nil || len(x) == 0 || len(y) == 0 || len(x) > 32 || len(y) > 32 {
		return nil, errors.New("jwk coordinates are not 32-byte base64url values")
	}
	raw := make([]byte, 65)
	raw[0] = 4
	copy(raw[1+32-len(x):33], x)
	copy(raw[33+32-len(y):], y)
	key, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		return nil, errors.New("jwk is not a point on P-256")
	}
	return key, nil
}

// PadJWKCoordinates rewrites the x and y of P-256 keys in a JWK or JWKS
// document to their full 32 bytes, so that strict parsers accept keys
// written without leading zero bytes (as indigo's client writes them).
func PadJWKCoordinates(key map[string]any) {
	if key["kty"] != "EC" || key["crv"] != "P-256" {
		return
	}
	for _, c := range []string{"x", "y"} {
		s, ok := key[c].(string)
		if !ok {
			continue
		}
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || len(b) >= 32 || len(b) == 0 {
			continue
		}
		padded := make([]byte, 32)
		copy(padded[32-len(b):], b)
		key[c] = base64.RawURLEncoding.EncodeToString(padded)
	}
}
