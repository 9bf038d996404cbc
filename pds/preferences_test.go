package pds

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	nsidGetPrefs = "app.bsky.actor.getPreferences"
	nsidPutPrefs = "app.bsky.actor.putPreferences"
)

func (e *accountEnv) prefs(t *testing.T, token string) []any {
	t.Helper()
	p, ok := e.get(t, nsidGetPrefs, token, nil).ok(t).json(t)["preferences"].([]any)
	require.True(t, ok)
	return p
}

func prefTypes(prefs []any) []string {
	var out []string
	for _, p := range prefs {
		out = append(out, p.(map[string]any)["$type"].(string))
	}
	return out
}

// TestPreferences: putPreferences replaces the app.bsky preferences and
// getPreferences returns them in order; personalDetailsPref needs the
// account password; declaredAgePref is derived, never stored.
func TestPreferences(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	u := e.createUser(t)
	app := e.appSession(t, u, "app", false)
	require.Empty(t, e.prefs(t, u.access))

	adult := map[string]any{"$type": "app.bsky.actor.defs#adultContentPref", "enabled": true}
	feeds := map[string]any{"$type": "app.bsky.actor.defs#savedFeedsPrefV2", "items": []any{
		map[string]any{"id": "3l6ovcmm2vd2j", "type": "timeline", "value": "following", "pinned": true}}}
	personal := map[string]any{"$type": "app.bsky.actor.defs#personalDetailsPref", "birthDate": "2000-01-01T00:00:00.000Z"}
	declared := map[string]any{"$type": "app.bsky.actor.defs#declaredAgePref", "isOverAge13": false}
	future := map[string]any{"$type": "app.bsky.actor.defs#somethingNewPref", "anything": "goes"}
	e.post(t, nsidPutPrefs, u.access, map[string]any{"preferences": []any{feeds, personal, declared, adult, future}}).ok(t)
	got := e.prefs(t, u.access)
	require.Equal(t, []string{feeds["$type"].(string), personal["$type"].(string), adult["$type"].(string), future["$type"].(string),
		declared["$type"].(string)}, prefTypes(got), "in the order put; declaredAgePref derived and last")
	require.Equal(t, feeds, got[0])
	require.Equal(t, map[string]any{"$type": declared["$type"], "isOverAge13": true, "isOverAge16": true, "isOverAge18": true}, got[4])

	// An app password sees no personal details, may not set them, and
	// leaves them in place when it puts the rest.
	require.Equal(t, []string{feeds["$type"].(string), adult["$type"].(string), future["$type"].(string), declared["$type"].(string)}, prefTypes(e.prefs(t, app)))
	e.post(t, nsidPutPrefs, app, map[string]any{"preferences": []any{personal}}).fails(t, 400, "InvalidRequest")
	e.post(t, nsidPutPrefs, app, map[string]any{"preferences": []any{adult}}).ok(t)
	require.Equal(t, []string{personal["$type"].(string), adult["$type"].(string), declared["$type"].(string)}, prefTypes(e.prefs(t, u.access)))

	before := e.prefs(t, u.access)
	for name, body := range map[string]any{
		"another namespace":     map[string]any{"preferences": []any{adult, map[string]any{"$type": "com.example.pref", "x": true}}},
		"no $type":              map[string]any{"preferences": []any{map[string]any{"enabled": true}}},
		"not an object":         map[string]any{"preferences": []any{"adult"}},
		"invalid known pref":    map[string]any{"preferences": []any{map[string]any{"$type": adult["$type"], "enabled": "yes"}}},
		"missing required":      map[string]any{"preferences": []any{map[string]any{"$type": adult["$type"]}}},
		"a float":               map[string]any{"preferences": []any{map[string]any{"$type": "app.bsky.actor.defs#newPref", "x": 1.5}}},
		"no preferences at all": map[string]any{},
	} {
		e.post(t, nsidPutPrefs, u.access, body).fails(t, 400, "InvalidRequest")
		require.Equal(t, before, e.prefs(t, u.access), name)
	}
	big := []byte(`{"preferences": [{"$type": "app.bsky.actor.defs#newPref", "x": "` + strings.Repeat("x", MaxPreferencesBody) + `"}]}`)
	e.do(t, http.MethodPost, nsidPutPrefs, u.access, bytes.NewReader(big), nil, nil).fails(t, 413, "PayloadTooLarge")
	e.get(t, nsidGetPrefs, "", nil).fails(t, 401, "AuthenticationRequired")
	e.post(t, nsidPutPrefs, "", map[string]any{"preferences": []any{}}).fails(t, 401, "AuthenticationRequired")

	// The administrator reads everything (for an export); a deactivated
	// account still reads and writes its own (a move copies them).
	admin := e.adminGet(t, "getPreferences", url.Values{"did": {u.did.String()}}).ok(t).json(t)["preferences"].([]any)
	require.Equal(t, before, admin)
	e.do(t, http.MethodGet, AdminNSIDPrefix+"getPreferences", "", nil, url.Values{"did": {u.did.String()}}, nil).fails(t, 401, "AuthenticationRequired")
	e.post(t, "com.atproto.server.deactivateAccount", u.access, map[string]any{}).ok(t)
	e.post(t, nsidPutPrefs, u.access, map[string]any{"preferences": []any{}}).ok(t)
	require.Empty(t, e.prefs(t, u.access))
}
