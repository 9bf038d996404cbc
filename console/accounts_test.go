package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/console"
)

// Account actions from the console: search, takedown and its reversal,
// deactivation, a password reset shown once (mail is held here), invite
// codes; each audited as the console.
func TestAccountActions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, envOptions{})
	did, _ := e.newRepo(t, "erin.test")
	b := e.browser(t)
	b.mustLogin()

	list := b.get(console.Prefix + "accounts?q=erin@example")
	require.Contains(t, list.body, `href="/admin/accounts/`+did.String()+`"`)
	page := b.get(console.Prefix + "accounts/" + did.String())
	require.Equal(t, http.StatusOK, page.status)
	status := console.Prefix + "accounts/" + did.String() + "/status"
	for _, step := range []struct {
		action string
		want   account.Status
	}{
		{"takedown", account.StatusTakendown},
		{"untakedown", account.StatusActive},
		{"deactivate", account.StatusDeactivated},
		{"reactivate", account.StatusActive},
	} {
		p := b.post(status, url.Values{"csrf": {page.csrf(t)}, "action": {step.action}, "ref": {"ticket 7"}})
		require.Equal(t, http.StatusOK, p.status, p.body)
		a, err := e.accounts.Get(ctx, did)
		require.NoError(t, err)
		require.Equal(t, step.want, a.Status, step.action)
	}
	entries, err := audit.List(ctx, e.pool, did.String(), 0, 10)
	require.NoError(t, err)
	require.Len(t, entries, 4)
	for _, en := range entries {
		require.Equal(t, console.AuditActor, en.Actor)
		require.Equal(t, "com.atproto.admin.updateSubjectStatus", en.Action)
	}

	// No SMTP: the new password is shown once and works; the old does not.
	p := b.post(console.Prefix+"accounts/"+did.String()+"/password", url.Values{"csrf": {page.csrf(t)}})
	require.Equal(t, http.StatusOK, p.status, p.body)
	m := regexp.MustCompile(`shown once: <code>([^<]+)</code>`).FindStringSubmatch(p.body)
	require.NotNil(t, m, p.body)
	_, _, err = e.accounts.Login(ctx, "erin.test", m[1])
	require.NoError(t, err)
	_, _, err = e.accounts.Login(ctx, "erin.test", "a password for erin.test")
	require.ErrorIs(t, err, account.ErrAuthFailed)
	require.NotContains(t, b.get(console.Prefix+"accounts/"+did.String()).body, m[1], "shown once")
	entries, err = audit.List(ctx, e.pool, did.String(), 0, 1)
	require.NoError(t, err)
	require.Equal(t, "com.atproto.admin.updateAccountPassword", entries[0].Action)
	require.NotContains(t, string(mustJSON(t, entries[0])), m[1], "the password stays out of the audit log")

	// Invite codes.
	inv := b.get(console.Prefix + "invites")
	p = b.post(console.Prefix+"invites", url.Values{"csrf": {inv.csrf(t)}, "count": {"2"}, "uses": {"3"}})
	require.Equal(t, http.StatusOK, p.status, p.body)
	codes, _, err := e.accounts.ListInviteCodes(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, codes, 2)
	for _, c := range codes {
		require.Equal(t, 3, c.Available)
		require.Contains(t, p.body, c.Code)
	}
}
