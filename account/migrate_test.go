package account

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"
)

func TestAgeOn(t *testing.T) {
	t.Parallel()
	birth := time.Date(2008, 3, 15, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		now  time.Time
		want int
	}{
		{time.Date(2026, 3, 14, 23, 0, 0, 0, time.UTC), 17},
		{time.Date(2026, 3, 15, 0, 0, 0, 0, time.UTC), 18},
		{time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC), 17},
		{time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC), 18},
	} {
		require.Equal(t, tc.want, ageOn(birth, tc.now), tc.now)
	}
}

// TestCreateImportedRefusals: only a did:plc can be brought, and an
// account of the DID hosted here is never replaced while its DID document
// names this server.
func TestCreateImportedRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	a, _, err := s.CreateAccount(ctx, CreateInput{Handle: "alice.test", Email: "alice@example.com", Password: "alice password"})
	require.NoError(t, err)

	in := CreateInput{Handle: "bob.test", Email: "bob@example.com", Password: "bob password", DID: "did:web:example.com"}
	_, _, err = s.CreateAccount(ctx, in)
	require.ErrorIs(t, err, ErrUnsupportedDID)
	in.DID = a.DID.String()
	_, _, err = s.CreateAccount(ctx, in)
	require.Error(t, err, "no service-auth token recorded")
	require.NotErrorIs(t, err, ErrAccountExists)
	in.ServiceAuth = testUse(a.DID)
	_, _, err = s.CreateAccount(ctx, in)
	require.ErrorIs(t, err, ErrAccountExists, "an active account")
	require.NoError(t, s.SetStatus(ctx, a.DID, StatusDeactivated))
	_, _, err = s.CreateAccount(ctx, in)
	require.ErrorIs(t, err, ErrAccountExists, "deactivated, but not moved away")
	got, err := s.Get(ctx, a.DID)
	require.NoError(t, err)
	require.Equal(t, "alice.test", got.Handle.String())

	// An unknown did:plc is created deactivated, without a PLC round trip;
	// it cannot be activated while its DID document names no one here.
	in.DID = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	in.ServiceAuth = testUse(syntax.DID(in.DID))
	b, sess, err := s.CreateAccount(ctx, in)
	require.NoError(t, err)
	require.Equal(t, StatusDeactivated, b.Status)
	require.NotEmpty(t, sess.AccessJwt)
	require.Error(t, s.CheckDIDDocument(ctx, b.DID, nil))
}

func TestPreferenceRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newService(t)
	a, _, err := s.CreateAccount(ctx, CreateInput{Handle: "alice.test", Email: "alice@example.com", Password: "alice password"})
	require.NoError(t, err)
	s.cfg.Now = func() time.Time { return time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC) }
	pref := func(typ, body string) Preference {
		return Preference{Type: typ, Value: json.RawMessage(`{"$type":"` + typ + `"` + body + `}`)}
	}
	personal := pref(PrefPersonalDetails, `,"birthDate":"2008-03-15"`)

	for name, prefs := range map[string][]Preference{
		"no type":          {{Value: json.RawMessage(`{}`)}},
		"other namespace":  {pref("com.example.pref", "")},
		"namespace prefix": {pref("app.bskyx.pref", "")},
	} {
		require.ErrorIs(t, s.PutPreferences(ctx, a.DID, prefs, true), ErrInvalidPreferences, name)
	}
	require.ErrorIs(t, s.PutPreferences(ctx, a.DID, []Preference{personal}, false), ErrInvalidPreferences, "personal details need full access")
	require.NoError(t, s.PutPreferences(ctx, a.DID, []Preference{personal, pref(PrefDeclaredAge, `,"isOverAge18":true`)}, true))

	got, err := s.Preferences(ctx, a.DID, true)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, PrefPersonalDetails, got[0].Type)
	var declared map[string]any
	require.NoError(t, json.Unmarshal(got[1].Value, &declared))
	require.Equal(t, map[string]any{"$type": PrefDeclaredAge, "isOverAge13": true, "isOverAge16": true, "isOverAge18": false}, declared,
		"derived from the birth date, a day short of 18; the one put is not stored")
	got, err = s.Preferences(ctx, a.DID, false)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, PrefDeclaredAge, got[0].Type)
	require.ErrorIs(t, s.PutPreferences(ctx, "did:plc:unknownunknownunknown", nil, true), ErrAccountNotFound)
}
