package dpop_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/testclock"
	"github.com/bulwark-pds/bulwark/oauth/dpop"
	"github.com/bulwark-pds/bulwark/oauth/dpop/dpoptest"
)

const target = "https://pds.example.com/oauth/token"

func newVerifier(capacity int) (*dpop.Verifier, *testclock.Clock) {
	clk := testclock.New(time.Now())
	v := dpop.NewVerifier(dpop.Config{Secret: []byte("0123456789abcdef0123456789abcdef"), Now: clk.Now, ReplayCapacity: capacity})
	return v, clk
}

func TestVerifyAcceptsGoodProofAndBindsKey(t *testing.T) {
	t.Parallel()
	v, clk := newVerifier(0)
	k := dpoptest.NewKey()
	p, err := v.Verify(k.Proof(dpoptest.Claims{Method: "POST", URL: target, Nonce: v.Nonce(), IssuedAt: clk.Now()}),
		dpop.Request{Method: "POST", URL: target})
	require.NoError(t, err)
	require.Equal(t, k.JKT(), p.JKT)
}

func TestVerifyRefusals(t *testing.T) {
	t.Parallel()
	k := dpoptest.NewKey()
	tests := []struct {
		name  string
		claim func(v *dpop.Verifier, now time.Time) dpoptest.Claims
		req   dpop.Request
		want  error
	}{
		{"no nonce", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "POST", URL: target, IssuedAt: now}
		}, dpop.Request{Method: "POST", URL: target}, dpop.ErrUseNonce},
		{"unknown nonce", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "POST", URL: target, Nonce: "made-up", IssuedAt: now}
		}, dpop.Request{Method: "POST", URL: target}, dpop.ErrUseNonce},
		{"wrong htu", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "POST", URL: "https://pds.example.com/oauth/par", Nonce: v.Nonce(), IssuedAt: now}
		}, dpop.Request{Method: "POST", URL: target}, dpop.ErrInvalidProof},
		{"wrong htm", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "GET", URL: target, Nonce: v.Nonce(), IssuedAt: now}
		}, dpop.Request{Method: "POST", URL: target}, dpop.ErrInvalidProof},
		{"stale iat", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "POST", URL: target, Nonce: v.Nonce(), IssuedAt: now.Add(-10 * time.Minute)}
		}, dpop.Request{Method: "POST", URL: target}, dpop.ErrInvalidProof},
		{"future iat", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "POST", URL: target, Nonce: v.Nonce(), IssuedAt: now.Add(5 * time.Minute)}
		}, dpop.Request{Method: "POST", URL: target}, dpop.ErrInvalidProof},
		{"wrong typ", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "POST", URL: target, Nonce: v.Nonce(), IssuedAt: now, Typ: "JWT"}
		}, dpop.Request{Method: "POST", URL: target}, dpop.ErrInvalidProof},
		{"missing ath", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "GET", URL: target, Nonce: v.Nonce(), IssuedAt: now}
		}, dpop.Request{Method: "GET", URL: target, AccessToken: "tok"}, dpop.ErrInvalidProof},
		{"ath of another token", func(v *dpop.Verifier, now time.Time) dpoptest.Claims {
			return dpoptest.Claims{Method: "GET", URL: target, Nonce: v.Nonce(), IssuedAt: now, AccessToken: "other"}
		}, dpop.Request{Method: "GET", URL: target, AccessToken: "tok"}, dpop.ErrInvalidProof},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, clk := newVerifier(0)
			_, err := v.Verify(k.Proof(tt.claim(v, clk.Now())), tt.req)
			require.ErrorIs(t, err, tt.want)
		})
	}
}

func TestVerifyRefusesGarbage(t *testing.T) {
	t.Parallel()
	v, _ := newVerifier(0)
	for _, p := range []string{"", "x", "a.b.c", string(make([]byte, dpop.MaxProofLen+1))} {
		_, err := v.Verify(p, dpop.Request{Method: "POST", URL: target})
		require.ErrorIs(t, err, dpop.ErrInvalidProof)
	}
}

func TestReplayRefusedButRetryAfterNonceErrorIsNot(t *testing.T) {
	t.Parallel()
	v, clk := newVerifier(0)
	k := dpoptest.NewKey()
	req := dpop.Request{Method: "POST", URL: target}

	// A proof refused for its nonce is not remembered.
	_, err := v.Verify(k.Proof(dpoptest.Claims{Method: "POST", URL: target, JTI: "one", IssuedAt: clk.Now()}), req)
	require.ErrorIs(t, err, dpop.ErrUseNonce)
	proof := k.Proof(dpoptest.Claims{Method: "POST", URL: target, JTI: "one", Nonce: v.Nonce(), IssuedAt: clk.Now()})
	_, err = v.Verify(proof, req)
	require.NoError(t, err)
	_, err = v.Verify(proof, req)
	require.ErrorIs(t, err, dpop.ErrReplay)

	// The same jti from another key is a different proof.
	_, err = v.Verify(dpoptest.NewKey().Proof(dpoptest.Claims{Method: "POST", URL: target, JTI: "one", Nonce: v.Nonce(), IssuedAt: clk.Now()}), req)
	require.NoError(t, err)
}

func TestNonceRotation(t *testing.T) {
	t.Parallel()
	v, clk := newVerifier(0)
	k := dpoptest.NewKey()
	req := dpop.Request{Method: "POST", URL: target}
	old := v.Nonce()
	clk.Advance(dpop.DefaultNonceRotation)
	require.NotEqual(t, old, v.Nonce(), "the nonce changes every window")

	// The previous window's nonce is still accepted...
	_, err := v.Verify(k.Proof(dpoptest.Claims{Method: "POST", URL: target, Nonce: old, IssuedAt: clk.Now()}), req)
	require.NoError(t, err)
	// ...but not once two windows have passed (it would be over 4 minutes old).
	clk.Advance(dpop.DefaultNonceRotation)
	_, err = v.Verify(k.Proof(dpoptest.Claims{Method: "POST", URL: target, Nonce: old, IssuedAt: clk.Now()}), req)
	require.ErrorIs(t, err, dpop.ErrUseNonce)
}

func TestReplayMemoryIsBounded(t *testing.T) {
	t.Parallel()
	v, clk := newVerifier(4)
	k := dpoptest.NewKey()
	req := dpop.Request{Method: "POST", URL: target}
	var proofs []string
	for range 8 {
		p := k.Proof(dpoptest.Claims{Method: "POST", URL: target, Nonce: v.Nonce(), IssuedAt: clk.Now()})
		_, err := v.Verify(p, req)
		require.NoError(t, err)
		proofs = append(proofs, p)
	}
	require.LessOrEqual(t, dpop.ReplayLen(v), 4)
	// The newest ones are still remembered.
	_, err := v.Verify(proofs[7], req)
	require.True(t, errors.Is(err, dpop.ErrReplay))

	// Expired ids are dropped: after the acceptance window nothing is kept.
	clk.Advance(dpop.DefaultMaxAge + dpop.DefaultLeeway + time.Second)
	_, err = v.Verify(k.Proof(dpoptest.Claims{Method: "POST", URL: target, Nonce: v.Nonce(), IssuedAt: clk.Now()}), req)
	require.NoError(t, err)
	require.Equal(t, 1, dpop.ReplayLen(v))
}

func TestNormalizeHTU(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://PDS.example.com:443/oauth/token?x=1#f": "https://pds.example.com/oauth/token",
		"http://localhost:2583/xrpc/a.b.c":              "http://localhost:2583/xrpc/a.b.c",
		"https://[::1]:8443/x":                          "https://[::1]:8443/x",
		"https://pds.example.com":                       "https://pds.example.com/",
	} {
		got, err := dpop.NormalizeHTU(in)
		require.NoError(t, err)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"/relative", "ftp://x/y", "https://user@x/y"} {
		_, err := dpop.NormalizeHTU(bad)
		require.Error(t, err, bad)
	}
}

// shortKey finds a key whose x or y has a leading zero byte, which
// indigo's client writes without it.
func shortKey(t *testing.T) *ecdsa.PrivateKey {
	for range 5000 {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		if len(k.X.Bytes()) < 32 || len(k.Y.Bytes()) < 32 {
			return k
		}
	}
	t.Fatal("no short key found")
	return nil
}

func TestProofWithShortCoordinates(t *testing.T) {
	t.Parallel()
	v, clk := newVerifier(0)
	k := shortKey(t)
	b64 := base64.RawURLEncoding.EncodeToString
	hdr, _ := json.Marshal(map[string]any{"typ": "dpop+jwt", "alg": "ES256", "jwk": map[string]string{
		"kty": "EC", "crv": "P-256", "x": b64(k.X.Bytes()), "y": b64(k.Y.Bytes())}})
	body, _ := json.Marshal(map[string]any{"jti": "j", "htm": "POST", "htu": target, "iat": clk.Now().Unix(), "nonce": v.Nonce()})
	input := b64(hdr) + "." + b64(body)
	sum := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, k, sum[:])
	require.NoError(t, err)
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	p, err := v.Verify(input+"."+b64(sig), dpop.Request{Method: "POST", URL: target})
	require.NoError(t, err)
	require.Equal(t, (&dpoptest.Key{Private: k}).JKT(), p.JKT, "the thumbprint is of the padded key")
}
