package keyring_test

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/internal/keyring"
)

var (
	secret = []byte(strings.Repeat("s", 40))
	now    = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
)

// Every purpose has its own label and its own key, and no key is the
// secret itself.
func TestPurposesDistinct(t *testing.T) {
	t.Parallel()
	r := keyring.MustNew(secret)
	labels, keys := map[string]bool{}, map[string]bool{}
	for _, p := range keyring.Purposes() {
		require.NotEmpty(t, p.String())
		require.False(t, labels[p.String()], "label %q twice", p)
		labels[p.String()] = true
		k := r.Key(p)
		require.Len(t, k, keyring.KeyLen)
		require.False(t, keys[string(k)], "key of %q twice", p)
		require.False(t, bytes.Contains(secret, k) || bytes.Contains(k, secret[:keyring.KeyLen]))
		keys[string(k)] = true
	}
	require.Panics(t, func() { r.Key(keyring.Purpose{}) })
}

// The OAuth keys are the ones derived before this package existed, so an
// upgrade keeps access tokens valid.
func TestOAuthKeysUnchanged(t *testing.T) {
	t.Parallel()
	r := keyring.MustNew(secret)
	for p, label := range map[keyring.Purpose]string{
		keyring.OAuthAccessToken: "bulwark oauth access token",
		keyring.OAuthCSRF:        "bulwark oauth csrf",
		keyring.OAuthDPoPNonce:   "bulwark oauth dpop nonce",
	} {
		want, err := hkdf.Key(sha256.New, secret, nil, label, 32)
		require.NoError(t, err)
		require.Equal(t, want, r.Key(p), label)
	}
}

func TestShortSecret(t *testing.T) {
	t.Parallel()
	_, err := keyring.New(secret[:31])
	require.ErrorIs(t, err, keyring.ErrShortSecret)
	require.Panics(t, func() { keyring.MustNew(nil) })
}

// A sealed value opens only for its own purpose, with its own ring
// (secret and binding), before it expires, and unchanged.
func TestSealOpen(t *testing.T) {
	t.Parallel()
	r := keyring.MustNew(secret)
	payload := []byte("0123456789abcdef")
	exp := now.Add(time.Hour)
	for _, p := range keyring.Purposes() {
		v := r.Seal(p, payload, exp)
		got, gotExp, err := r.Open(p, v, now)
		require.NoError(t, err, p)
		require.Equal(t, payload, got)
		require.True(t, exp.Equal(gotExp))
		for _, q := range keyring.Purposes() {
			if q != p {
				_, _, err := r.Open(q, v, now)
				require.ErrorIs(t, err, keyring.ErrInvalid, "%s opened as %s", p, q)
			}
		}
	}
	v := r.Seal(keyring.ConsoleSession, payload, exp)
	other := keyring.MustNew(bytes.Repeat([]byte("o"), 40))
	for name, open := range map[string]func() error{
		"another secret":  func() error { _, _, err := other.Open(keyring.ConsoleSession, v, now); return err },
		"another binding": func() error { _, _, err := r.With("pw").Open(keyring.ConsoleSession, v, now); return err },
		"expired":         func() error { _, _, err := r.Open(keyring.ConsoleSession, v, exp); return err },
		"empty":           func() error { _, _, err := r.Open(keyring.ConsoleSession, "", now); return err },
		"not base64":      func() error { _, _, err := r.Open(keyring.ConsoleSession, "!!"+v, now); return err },
		"too long": func() error {
			_, _, err := r.Open(keyring.ConsoleSession, strings.Repeat("A", keyring.MaxSealed+4), now)
			return err
		},
	} {
		require.ErrorIs(t, open(), keyring.ErrInvalid, name)
	}
	raw, err := base64.RawURLEncoding.DecodeString(v)
	require.NoError(t, err)
	for i := range raw {
		c := bytes.Clone(raw)
		c[i] ^= 1
		_, _, err := r.Open(keyring.ConsoleSession, base64.RawURLEncoding.EncodeToString(c), now)
		require.ErrorIs(t, err, keyring.ErrInvalid, "byte %d changed", i)
	}
	bound := r.With("pw")
	_, _, err = bound.Open(keyring.ConsoleSession, bound.Seal(keyring.ConsoleSession, payload, exp), now)
	require.NoError(t, err)
	_, _, err = r.With("pw2").Open(keyring.ConsoleSession, bound.Seal(keyring.ConsoleSession, payload, exp), now)
	require.ErrorIs(t, err, keyring.ErrInvalid)
	_, _, err = bound.With("more").Open(keyring.ConsoleSession, bound.Seal(keyring.ConsoleSession, payload, exp), now)
	require.ErrorIs(t, err, keyring.ErrInvalid, "bindings add up")
}

// A tag checks only for its own purpose and data; splitting the data
// differently is other data.
func TestTag(t *testing.T) {
	t.Parallel()
	r := keyring.MustNew(secret)
	id := []byte("session id 16 b.")
	for _, p := range keyring.Purposes() {
		tag := r.Tag(p, id)
		require.True(t, r.CheckTag(p, tag, id))
		require.False(t, r.CheckTag(p, tag, []byte("another id......")))
		require.False(t, r.CheckTag(p, tag+"A", id))
		require.False(t, r.CheckTag(p, "", id))
		for _, q := range keyring.Purposes() {
			if q != p {
				require.False(t, r.CheckTag(q, tag, id), "%s checked as %s", p, q)
			}
		}
	}
	require.NotEqual(t, r.Tag(keyring.ConsoleLoginCSRF, []byte("ab"), []byte("c")), r.Tag(keyring.ConsoleLoginCSRF, []byte("a"), []byte("bc")))
	require.False(t, r.CheckTag(keyring.ConsoleLoginCSRF, r.Tag(keyring.ConsoleLoginCSRF, id), id, nil))
}
