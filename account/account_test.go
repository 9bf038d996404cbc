package account

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/stretchr/testify/require"
)

func TestPasswordHash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newHasher(PasswordParams{Memory: 64, Time: 1, Threads: 1}, nil, 0)
	enc, err := h.hash(ctx, "correct horse")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(enc, "$argon2id$v=19$m=64,t=1,p=1$"), enc)
	ok, err := h.verify(ctx, "correct horse", enc)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = h.verify(ctx, "correct horsE", enc)
	require.NoError(t, err)
	require.False(t, ok)
	// Parameters come from the stored hash, so they can be raised later.
	h2 := newHasher(PasswordParams{Memory: 128, Time: 2, Threads: 1}, nil, 0)
	ok, err = h2.verify(ctx, "correct horse", enc)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = h.verify(ctx, "x", "$scrypt$nope")
	require.Error(t, err)

	a1, err := h.appPasswordHash(ctx, "did:plc:a", "abcd-efgh-ijkl-mnop")
	require.NoError(t, err)
	a2, err := h.appPasswordHash(ctx, "did:plc:b", "abcd-efgh-ijkl-mnop")
	require.NoError(t, err)
	require.NotEqual(t, a1, a2, "app password hashes are salted per account")
	require.True(t, looksLikeAppPassword(generateAppPassword()))
	require.False(t, looksLikeAppPassword("correct horse battery"))
}

func TestNewPasswordRules(t *testing.T) {
	t.Parallel()
	for pw, ok := range map[string]bool{
		"short":                  false,
		"        ":               false,
		"eight ch":               true,
		strings.Repeat("x", 256): true,
		strings.Repeat("x", 257): false,
		"ünïcödé!":               true,
	} {
		err := checkNewPassword(pw)
		if ok {
			require.NoError(t, err, pw)
		} else {
			require.ErrorIs(t, err, ErrInvalidPassword, pw)
		}
	}
}

func TestKeySealing(t *testing.T) {
	t.Parallel()
	ks, err := NewKeyStore(nil, []byte(strings.Repeat("s", 32)))
	require.NoError(t, err)
	key, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	blob, err := ks.seal("did:plc:alice", key)
	require.NoError(t, err)
	require.NotContains(t, string(blob), string(key.Bytes()))
	got, err := ks.open("did:plc:alice", blob)
	require.NoError(t, err)
	require.Equal(t, key.Bytes(), got.Bytes())

	_, err = ks.open("did:plc:mallory", blob)
	require.Error(t, err, "a sealed key is bound to its DID")
	other, err := NewKeyStore(nil, []byte(strings.Repeat("t", 32)))
	require.NoError(t, err)
	_, err = other.open("did:plc:alice", blob)
	require.Error(t, err, "and to the server secret")
	_, err = NewKeyStore(nil, []byte("short"))
	require.Error(t, err)
}

func TestHandleRules(t *testing.T) {
	t.Parallel()
	s := &Service{cfg: Config{HandleDomains: []string{".example.com", ".test"}}}
	for raw, want := range map[string]error{
		"alice.example.com":        nil,
		"ALICE.Test":               nil,
		"al.test":                  ErrInvalidHandle,
		"abcdefghijklmnopqrs.test": ErrInvalidHandle,
		"a.b.c.test":               ErrInvalidHandle,
		"alice.example.org":        ErrUnsupportedDomain,
		"example.com":              ErrUnsupportedDomain,
		"admin.example.com":        ErrHandleNotAvailable,
		"not a handle":             ErrInvalidHandle,
		"-x-.test":                 ErrInvalidHandle,
	} {
		h, err := s.NormalizeHandle(raw)
		if want == nil {
			require.NoError(t, err, raw)
			require.Equal(t, strings.ToLower(raw), h.String())
			continue
		}
		require.True(t, errors.Is(err, want), "%s: got %v, want %v", raw, err, want)
	}
}

// BenchmarkPasswordVerify is one login's KDF cost with the production
// parameters (DefaultPasswordParams).
//
//	go test ./account -run '^$' -bench PasswordVerify
func BenchmarkPasswordVerify(b *testing.B) {
	ctx := context.Background()
	h := newHasher(DefaultPasswordParams, nil, 0)
	enc, err := h.hash(ctx, "correct horse battery")
	require.NoError(b, err)
	b.ResetTimer()
	for b.Loop() {
		ok, err := h.verify(ctx, "correct horse battery", enc)
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
