package account

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// mapResolver resolves handles from a map; a lookup of a name it has not
// is counted and fails.
type mapResolver struct {
	dids   map[string]syntax.DID
	lookup []string
}

func (m *mapResolver) ResolveHandle(_ context.Context, h syntax.Handle) (syntax.DID, error) {
	m.lookup = append(m.lookup, h.String())
	if d, ok := m.dids[h.String()]; ok {
		return d, nil
	}
	return "", errors.New("not found")
}

func TestCheckHandle(t *testing.T) {
	t.Parallel()
	s := &Service{cfg: Config{HandleDomains: []string{".test"}}, log: slog.Default()}
	const alice, bob = syntax.DID("did:plc:alicealicealicealicealic"), syntax.DID("did:plc:bobbobbobbobbobbobbobbob")
	r := &mapResolver{dids: map[string]syntax.DID{"alice.example.org": alice}}
	ctx := context.Background()

	h, err := s.CheckHandle(ctx, "Alice.Example.ORG", alice, r)
	require.NoError(t, err)
	require.Equal(t, syntax.Handle("alice.example.org"), h)
	_, err = s.CheckHandle(ctx, "alice.example.org", bob, r)
	require.ErrorIs(t, err, ErrHandleNotResolved)
	_, err = s.CheckHandle(ctx, "nobody.example.org", alice, r)
	require.ErrorIs(t, err, ErrHandleNotResolved)
	// Without a resolver, only the server's domains.
	_, err = s.CheckHandle(ctx, "alice.example.org", alice, nil)
	require.ErrorIs(t, err, ErrUnsupportedDomain)

	r.lookup = nil
	for raw, want := range map[string]error{
		"alice.local": ErrInvalidHandle, "x.onion": ErrInvalidHandle, "a.example": ErrInvalidHandle,
		"alice.example.org.": ErrInvalidHandle, "a.b.test": ErrInvalidHandle, "admin.test": ErrHandleNotAvailable,
	} {
		_, err := s.CheckHandle(ctx, raw, alice, r)
		require.ErrorIs(t, err, want, raw)
	}
	require.Empty(t, r.lookup, "names that cannot be handles, or are the server's, are never looked up")
	h, err = s.CheckHandle(ctx, "Carol.TEST", alice, r)
	require.NoError(t, err)
	require.Equal(t, syntax.Handle("carol.test"), h)
}

func TestReservedKeys(t *testing.T) {
	t.Parallel()
	ks, err := NewKeyStore(nil, []byte(strings.Repeat("s", 32)))
	require.NoError(t, err)
	a1, err := ks.reserved("did:plc:alice")
	require.NoError(t, err)
	a2, err := ks.reserved("did:plc:alice")
	require.NoError(t, err)
	require.Equal(t, a1.Bytes(), a2.Bytes())
	b, err := ks.reserved("did:plc:bob")
	require.NoError(t, err)
	require.NotEqual(t, a1.Bytes(), b.Bytes())
	other, err := NewKeyStore(nil, []byte(strings.Repeat("t", 32)))
	require.NoError(t, err)
	a3, err := other.reserved("did:plc:alice")
	require.NoError(t, err)
	require.NotEqual(t, a1.Bytes(), a3.Bytes(), "derived from the server secret")
}
