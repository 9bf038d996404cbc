package pds

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
)

// lastAudit is the newest audit entry about subject, its states decoded.
func lastAudit(t *testing.T, e *accountEnv, subject string) (audit.Entry, map[string]any, map[string]any) {
	t.Helper()
	entries, err := audit.List(context.Background(), e.pool, subject, 0, 1)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "no audit entry about %s", subject)
	state := func(v any) map[string]any {
		if v == nil {
			return nil
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal(v.(json.RawMessage), &m))
		return m
	}
	return entries[0], state(entries[0].Before), state(entries[0].After)
}

// Every admin write the CLI makes is audited, with the state before the
// change where there is one: invite codes made (`invite create`), an
// account made with the admin password (`account create`), a password
// set (the sessions and app passwords it ended), invite codes disabled.
func TestAdminWritesAudited(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	admin := http.Header{"Authorization": {"Basic " + basic("admin", testAdminPassword)}}

	// invite create: com.atproto.server.createInviteCode.
	res := e.do(t, http.MethodPost, "com.atproto.server.createInviteCode", "", strings.NewReader(`{"useCount":2}`), nil, admin).ok(t)
	code := res.str(t, "code")
	entry, before, after := lastAudit(t, e, "invite_codes")
	require.Equal(t, "admin", entry.Actor)
	require.Equal(t, "com.atproto.server.createInviteCode", entry.Action)
	require.Nil(t, before)
	require.Equal(t, map[string]any{"admin": []any{code}}, after["codes"])
	require.Equal(t, float64(2), after["useCount"])

	// account create: createAccount with the admin password is the
	// administrator's, audited; with a wrong one it is refused and makes
	// nothing.
	counts := e.rowCounts(t)
	wrong := http.Header{"Authorization": {"Basic " + basic("admin", "not the admin password")}}
	body := `{"handle":"madebyadmin.test","email":"madebyadmin@example.com","password":"correct horse battery","inviteCode":"` + code + `"}`
	e.do(t, http.MethodPost, "com.atproto.server.createAccount", "", strings.NewReader(body), nil, wrong).fails(t, http.StatusUnauthorized, "AuthenticationRequired")
	require.Equal(t, counts["accounts"], e.rowCounts(t)["accounts"])
	res = e.do(t, http.MethodPost, "com.atproto.server.createAccount", "", strings.NewReader(body), nil, admin).ok(t)
	did := res.str(t, "did")
	entry, before, after = lastAudit(t, e, did)
	require.Equal(t, "com.atproto.server.createAccount", entry.Action)
	require.Nil(t, before)
	require.Equal(t, map[string]any{"handle": "madebyadmin.test", "email": "madebyadmin@example.com", "status": "active", "inviteCode": code}, after)
	// An ordinary sign-up is nobody's admin write.
	u := e.createUser(t)
	require.Empty(t, auditActions(t, e.pool, u.did.String()))

	// account reset-password: the sessions and app passwords it ends.
	e.post(t, "com.atproto.server.createAppPassword", u.access, map[string]any{"name": "phone"}).ok(t)
	e.post(t, "com.atproto.server.createSession", "", map[string]any{"identifier": u.handle, "password": u.pass}).ok(t)
	e.adminProc(t, "updateAccountPassword", &comatproto.AdminUpdateAccountPassword_Input{Did: u.did.String(), Password: "another long password"}).ok(t)
	entry, before, after = lastAudit(t, e, u.did.String())
	require.Equal(t, "com.atproto.admin.updateAccountPassword", entry.Action)
	require.Equal(t, map[string]any{"sessions": float64(2), "appPasswords": float64(1)}, before)
	require.Equal(t, map[string]any{"password": "changed", "sessions": float64(0), "appPasswords": float64(0)}, after)

	// disableInviteCodes: which codes went from enabled to disabled.
	e.adminProc(t, "disableInviteCodes", &comatproto.AdminDisableInviteCodes_Input{Codes: []string{code, "no-such-code"}}).ok(t)
	entry, before, after = lastAudit(t, e, "invite_codes")
	require.Equal(t, "com.atproto.admin.disableInviteCodes", entry.Action)
	require.Equal(t, map[string]any{"codes": []any{code}, "disabled": false}, before)
	require.Equal(t, []any{code}, after["codes"])
	require.Equal(t, true, after["disabled"])
}
