package account

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
)

// SearchAccounts finds accounts by DID, part of a handle or an email,
// treats LIKE wildcards as text, filters by status; CountByStatus counts
// each status.
func TestSearchAndCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	alice, _, err := s.CreateAccount(ctx, CreateInput{Handle: "alice.test", Email: "alice@example.com", Password: "alice password"})
	require.NoError(t, err)
	bob, _, err := s.CreateAccount(ctx, CreateInput{Handle: "bob.test", Email: "bob_x@example.org", Password: "bob password"})
	require.NoError(t, err)
	_, _, err = s.CreateAccount(ctx, CreateInput{Handle: "carol.test", Email: "carol@example.org", Password: "carol password"})
	require.NoError(t, err)
	applied := &StatusAttr{Applied: true}
	require.NoError(t, s.ModerateAccount(ctx, bob.DID, Moderation{Takedown: applied}, &audit.Entry{Actor: "test", Action: "takedown", Subject: bob.DID.String()}))

	handles := func(q Search) []string {
		t.Helper()
		got, err := s.SearchAccounts(ctx, q)
		require.NoError(t, err)
		var out []string
		for _, a := range got {
			out = append(out, a.Handle.String())
		}
		return out
	}
	require.Equal(t, []string{"carol.test", "bob.test", "alice.test"}, handles(Search{}), "newest first")
	require.Equal(t, []string{"alice.test"}, handles(Search{Text: alice.DID.String()}))
	require.Equal(t, []string{"alice.test"}, handles(Search{Text: "ALI"}))
	require.Equal(t, []string{"carol.test", "bob.test"}, handles(Search{Text: "example.org"}))
	require.Equal(t, []string{"bob.test"}, handles(Search{Text: "_x"}), "_ is a character, not a wildcard")
	require.Empty(t, handles(Search{Text: "%"}))
	require.Equal(t, []string{"bob.test"}, handles(Search{Status: StatusTakendown}))
	require.Equal(t, []string{"carol.test"}, handles(Search{Limit: 1}))

	_, err = s.SearchAccounts(ctx, Search{Text: strings.Repeat("a", MaxSearchText+1)})
	require.ErrorIs(t, err, ErrInvalidSearch)
	_, err = s.SearchAccounts(ctx, Search{Status: "gone"})
	require.ErrorIs(t, err, ErrInvalidSearch)

	counts, err := s.CountByStatus(ctx)
	require.NoError(t, err)
	require.Equal(t, map[Status]int64{StatusActive: 2, StatusTakendown: 1}, counts)
}
