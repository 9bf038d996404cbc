package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/console"
	"github.com/bulwark-pds/bulwark/email"
)

// consoleAudit is the newest audit entry about subject, which the console
// wrote, with its states decoded.
func consoleAudit(t *testing.T, e *env, subject string) (audit.Entry, map[string]any, map[string]any) {
	t.Helper()
	entries, err := audit.List(context.Background(), e.pool, subject, 0, 1)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "no audit entry about %s", subject)
	require.Equal(t, console.AuditActor, entries[0].Actor)
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

// The console's account actions are audited like the CLI's: invite codes
// made, a password reset mailed, a generated password set (with the
// sessions and app passwords it ended), and the audit page shows each
// change as before → after.
func TestConsoleActionsAudited(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{smtp: true})
	did, _ := e.newRepo(t, "audited.test")
	b := e.browser(t)
	b.mustLogin()

	invites := b.get(console.Prefix + "invites")
	p := b.post(console.Prefix+"invites", url.Values{"csrf": {invites.csrf(t)}, "count": {"2"}, "uses": {"3"}, "for": {did.String()}})
	require.Equal(t, http.StatusOK, p.status, p.body)
	entry, before, after := consoleAudit(t, e, did.String())
	require.Equal(t, "com.atproto.server.createInviteCodes", entry.Action)
	require.Nil(t, before)
	require.Len(t, after["codes"].(map[string]any)[did.String()], 2)
	require.Equal(t, float64(3), after["useCount"])

	page := b.get(console.Prefix + "accounts/" + did.String())
	require.Contains(t, page.body, "Mail a password reset code")
	p = b.post(console.Prefix+"accounts/"+did.String()+"/password", url.Values{"csrf": {page.csrf(t)}})
	require.Equal(t, http.StatusOK, p.status, p.body)
	require.Contains(t, p.body, "A password reset code was mailed")
	entry, _, after = consoleAudit(t, e, did.String())
	require.Equal(t, "com.atproto.server.requestPasswordReset", entry.Action)
	require.Equal(t, map[string]any{"mailedTo": "audited@example.com"}, after)
	pending, err := e.accounts.Mail().PendingTokens(context.Background(), e.pool, did)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, email.PurposeResetPassword, pending[0].Purpose)

	p = b.post(console.Prefix+"accounts/"+did.String()+"/password", url.Values{"csrf": {page.csrf(t)}, "generate": {"1"}})
	require.Equal(t, http.StatusOK, p.status, p.body)
	entry, before, after = consoleAudit(t, e, did.String())
	require.Equal(t, "com.atproto.admin.updateAccountPassword", entry.Action)
	require.Equal(t, map[string]any{"sessions": float64(1), "appPasswords": float64(0)}, before)
	require.Equal(t, map[string]any{"password": "changed", "sessions": float64(0), "appPasswords": float64(0)}, after)

	log := b.get(console.Prefix + "audit?subject=" + did.String())
	require.Equal(t, http.StatusOK, log.status)
	require.Contains(t, log.body, "Change (before → after)")
	require.Regexp(t, `<code>\{[^<]*&#34;sessions&#34;:1[^<]*\}</code> → <code>\{[^<]*&#34;password&#34;:&#34;changed&#34;[^<]*\}</code>`, log.body)
	require.Contains(t, log.body, "com.atproto.server.requestPasswordReset")
	require.Contains(t, log.body, "com.atproto.server.createInviteCodes")
}
