package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every admin write of the CLI shows up in `bulwark admin audit`, with the
// state before it where there is one: `invite create`, `account create`
// (with the admin password, so the administrator's) and `account
// reset-password`.
func TestAdminAuditShowsEveryWrite(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{})
	codes := strings.Fields(s.admin(t, "invite", "create", "--uses", "2"))
	require.Len(t, codes, 1)
	out := s.admin(t, "account", "create", "--handle", "carla.test", "--email", "carla@example.com")
	did := field(t, out, "DID")
	s.admin(t, "account", "reset-password", did)

	log := s.admin(t, "audit")
	require.Regexp(t, `TIME\s+ACTION\s+SUBJECT\s+ACTOR\s+CHANGE\s+REASON`, log)
	require.Regexp(t, `com\.atproto\.server\.createInviteCode\s+invite_codes\s+admin\s+\{.*`+regexp.QuoteMeta(codes[0]), log)
	require.Regexp(t, `com\.atproto\.server\.createAccount\s+`+regexp.QuoteMeta(did)+`\s+admin\s+\{.*"handle":"carla\.test"`, log)
	require.Regexp(t, `com\.atproto\.admin\.updateAccountPassword\s+`+regexp.QuoteMeta(did)+`\s+admin\s+\{"sessions":1,"appPasswords":0\} → \{"password":"changed","sessions":0,"appPasswords":0\}`, log)
}
