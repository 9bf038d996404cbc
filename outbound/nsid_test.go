package outbound

import (
	"context"
	"errors"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

// TestResolveNSID: the DID comes from _lexicon.<reversed authority> only
// (never a parent or child name), through the client's resolver; a
// missing record is not-found, a DNS failure or two DIDs a failure, and a
// reserved top-level domain is never looked up.
func TestResolveNSID(t *testing.T) {
	t.Parallel()
	r := &fakeResolver{
		txt: map[string][]string{
			"_lexicon.feed.example.com":  {"did=" + didAlice},
			"_lexicon.example.com":       {"did=" + didBob},
			"_lexicon.twice.example.com": {"did=" + didAlice, "did=" + didBob},
			"_lexicon.app.example.local": {"did=" + didAlice},
		},
		txtErr: map[string]error{"_lexicon.broken.example.com": errors.New("server failure")},
	}
	c := New(Config{Resolver: r})
	resolve := func(nsid string) (syntax.DID, error) {
		return c.ResolveNSID(context.Background(), syntax.NSID(nsid))
	}
	did, err := resolve("com.example.feed.post")
	require.NoError(t, err)
	require.Equal(t, syntax.DID(didAlice), did)
	did, err = resolve("com.example.authFull")
	require.NoError(t, err)
	require.Equal(t, syntax.DID(didBob), did)

	// com.example.feed.sub.thing's authority has no record: its parents'
	// records are not used.
	_, err = resolve("com.example.feed.sub.thing")
	require.ErrorIs(t, err, ErrNSIDNotFound)
	_, err = resolve("com.example.twice.x")
	require.ErrorIs(t, err, ErrNSIDResolutionFailed)
	_, err = resolve("com.example.broken.x")
	require.ErrorIs(t, err, ErrNSIDResolutionFailed)
	before := r.txtN.Load()
	_, err = resolve("local.example.app.x")
	require.ErrorIs(t, err, ErrNSIDNotFound)
	require.Equal(t, before, r.txtN.Load(), "a reserved TLD is not looked up")
}
