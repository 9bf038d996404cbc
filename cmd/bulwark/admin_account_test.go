package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeRelay records the requestCrawl calls it gets; fail makes it refuse.
func fakeRelay(t *testing.T, fail bool) (string, <-chan string) {
	t.Helper()
	srv, got := newFakeRelay(fail)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, got
}

// fakeRelayOn is fakeRelay serving on ln.
func fakeRelayOn(t *testing.T, ln net.Listener) (string, <-chan string) {
	t.Helper()
	srv, got := newFakeRelay(false)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, got
}

func newFakeRelay(fail bool) (*httptest.Server, chan string) {
	got := make(chan string, 16)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/xrpc/com.atproto.sync.requestCrawl" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		var in struct {
			Hostname string `json:"hostname"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&in)
		got <- in.Hostname
		if fail {
			http.Error(w, `{"error":"InternalServerError"}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{}"))
	}))
	return srv, got
}

// field reads "Label   value" from a two-column text table.
func field(t *testing.T, out, label string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(label) + `\s+(\S+)\s*$`).FindStringSubmatch(out)
	require.NotNil(t, m, "no %q in:\n%s", label, out)
	return m[1]
}

type listedAccounts struct {
	Accounts []accountRow `json:"accounts"`
}

func (l listedAccounts) byHandle(handle string) *accountRow {
	for i := range l.Accounts {
		if l.Accounts[i].Handle == handle {
			return &l.Accounts[i]
		}
	}
	return nil
}

// TestAdminAccountCommands drives every account command against a running
// server that requires invites, as its operator would: the password comes
// from the data dir.
func TestAdminAccountCommands(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{extra: []string{"--invite-required"}})

	// The first-account command exactly as the start banner prints it: an
	// invite is minted with the admin password, the password generated.
	out := s.admin(t, "account", "create", "--handle", "alice.test", "--email", "alice@example.com")
	aliceDID, alicePW := field(t, out, "DID"), field(t, out, "Password")
	require.Equal(t, "alice.test", field(t, out, "Handle"))
	require.True(t, strings.HasPrefix(aliceDID, "did:plc:"), out)
	_, status := s.login(t, "alice.test", alicePW)
	require.Equal(t, http.StatusOK, status, "the new account can log in")

	// A bare name gets the server's handle domain; --json parses back.
	var bob createdAccount
	s.adminJSON(t, &bob, "account", "create", "--handle", "bob", "--email", "bob@example.com", "--password", "bob-password-1")
	require.Equal(t, "bob.test", bob.Handle)
	require.Equal(t, "bob-password-1", bob.Password)
	require.NotEmpty(t, bob.InviteCode, "an invite was minted")

	out = s.admin(t, "account", "list")
	require.Regexp(t, `HANDLE\s+EMAIL\s+DID\s+STATUS\s+CREATED`, out)
	require.Regexp(t, `alice\.test\s+alice@example\.com\s+`+regexp.QuoteMeta(aliceDID)+`\s+active`, out)
	var list listedAccounts
	s.adminJSON(t, &list, "account", "list")
	require.Len(t, list.Accounts, 2)
	require.Equal(t, bob.DID, list.byHandle("bob.test").DID)

	// info by handle and by DID; email and handle changes show up there.
	out = s.admin(t, "account", "info", "alice.test")
	require.Equal(t, aliceDID, field(t, out, "DID"))
	require.Equal(t, "active", field(t, out, "Status"))
	s.admin(t, "account", "update-email", "alice.test", "alice2@example.com")
	s.admin(t, "account", "update-handle", aliceDID, "alice2.test")
	var info accountInfoOutput
	s.adminJSON(t, &info, "account", "info", aliceDID)
	require.Equal(t, "alice2.test", info.Account.Handle)
	require.Equal(t, "alice2@example.com", *info.Account.Email)
	require.False(t, info.Takedown.Applied)

	// reset-password: the old password stops working, the printed one works.
	var reset accountChange
	s.adminJSON(t, &reset, "account", "reset-password", "alice2.test")
	require.Equal(t, aliceDID, reset.DID)
	_, status = s.login(t, "alice2.test", alicePW)
	require.Equal(t, http.StatusUnauthorized, status)
	_, status = s.login(t, "alice2.test", reset.Password)
	require.Equal(t, http.StatusOK, status)

	// takedown and back.
	s.admin(t, "account", "takedown", "bob.test", "--ref", "ticket-7")
	s.adminJSON(t, &info, "account", "info", "bob.test")
	require.True(t, info.Takedown.Applied)
	require.Equal(t, "ticket-7", *info.Takedown.Ref)
	status, body := s.xrpc(t, http.MethodGet, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {bob.DID}}, nil, nil)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(body), "RepoTakendown")
	s.adminJSON(t, &list, "account", "list")
	require.Equal(t, "takendown", list.byHandle("bob.test").Status)
	s.admin(t, "account", "untakedown", "bob.test")
	require.Equal(t, "active", field(t, s.admin(t, "account", "info", bob.DID), "Status"))

	// delete: refused without --yes, then gone for good.
	code, _, errOut := cli("admin", "--url", s.url, "--data-dir", s.dataDir, "account", "delete", "bob.test")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--yes")
	s.admin(t, "account", "delete", "bob.test", "--yes")
	s.adminJSON(t, &list, "account", "list")
	require.Nil(t, list.byHandle("bob.test"))
	code, _, errOut = cli("admin", "--url", s.url, "--data-dir", s.dataDir, "account", "info", bob.DID)
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "NotFound")

	// Every change is in the audit log.
	var audit struct {
		Entries []auditEntry `json:"entries"`
	}
	s.adminJSON(t, &audit, "audit", "--limit", "100")
	actions := map[string]bool{}
	for _, e := range audit.Entries {
		actions[e.Action] = true
	}
	for _, a := range []string{"updateAccountEmail", "updateAccountHandle", "updateAccountPassword", "updateSubjectStatus", "deleteAccount"} {
		require.True(t, actions["com.atproto.admin."+a], "audit log lacks %s: %v", a, actions)
	}
}

// TestAdminInvitesAndCrawl: invite codes that createAccount accepts, and
// requestCrawl to the configured relay or the ones given.
func TestAdminInvitesAndCrawl(t *testing.T) {
	t.Parallel()
	relay, crawled := fakeRelay(t, false)
	// The relays named to request-crawl below are on this machine: the
	// server's outbound guard reaches them only with the allow list.
	s := startLiveServer(t, serverOptions{extra: []string{"--invite-required", "--crawlers", relay, "--proxy-allow-private", "127.0.0.1/32"}})

	// invite create: codes that createAccount accepts.
	var inv struct {
		Codes []string `json:"codes"`
	}
	s.adminJSON(t, &inv, "invite", "create", "--uses", "2", "--count", "2")
	require.Len(t, inv.Codes, 2)
	status, body := s.xrpc(t, http.MethodPost, "com.atproto.server.createAccount", "", nil, map[string]string{
		"handle": "carol.test", "email": "carol@example.com", "password": "carol-password-1", "inviteCode": inv.Codes[0]}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Len(t, strings.Fields(s.admin(t, "invite", "create")), 1, "one code a line")

	// request-crawl: the configured crawler by default, or the relays given.
	out := s.admin(t, "request-crawl")
	require.Regexp(t, regexp.QuoteMeta(relay)+`\s+ok`, out)
	require.Equal(t, s.hostname, <-crawled)
	other, otherCrawled := fakeRelay(t, false)
	var crawl struct {
		Hostname string        `json:"hostname"`
		Results  []crawlResult `json:"results"`
	}
	s.adminJSON(t, &crawl, "request-crawl", other)
	require.Equal(t, []crawlResult{{Relay: other, OK: true}}, crawl.Results)
	require.Equal(t, s.hostname, <-otherCrawled)
	broken, brokenCrawled := fakeRelay(t, true)
	code, out, errOut := cli("admin", "--url", s.url, "--data-dir", s.dataDir, "request-crawl", broken)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "FAILED")
	require.Contains(t, errOut, "1 of 1 relay(s)")
	<-brokenCrawled
}

// TestAdminAuthAndUsage: a wrong password fails clearly with exit 1; a
// server that is not there too; -h exits 0 at every level.
func TestAdminAuthAndUsage(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{})

	code, out, errOut := cli("admin", "--url", s.url, "--admin-password", "wrong", "account", "list")
	require.Equal(t, 1, code, out)
	require.Empty(t, out)
	require.Contains(t, errOut, "AuthenticationRequired")
	require.Contains(t, errOut, "refused the admin password from --admin-password")

	// BULWARK_LISTEN-style defaults are not at play here: name a closed port.
	code, _, errOut = cli("admin", "--url", "http://127.0.0.1:1", "--admin-password", "x", "audit")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "cannot reach the server")

	code, _, errOut = cli("admin", "--data-dir", t.TempDir(), "--url", s.url, "audit")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no admin password")

	helps := [][]string{{"admin", "--help"}, {"admin", "-h"}, {"admin", "help"}, {"backup", "-h"}, {"restore", "--help"}}
	for _, g := range adminGroups {
		helps = append(helps, []string{"admin", g.name, "--help"})
		for _, c := range g.commands {
			helps = append(helps, append(append([]string{"admin"}, strings.Fields(c.path)...), "-h"))
		}
	}
	for _, args := range helps {
		code, out, errOut := cli(args...)
		require.Equal(t, 0, code, "%v: %s", args, errOut)
		require.Contains(t, out+errOut, "bulwark", "%v prints its usage", args)
	}
	code, out, errOut = cli("admin", "--help")
	require.Equal(t, 0, code)
	for _, c := range []string{"account list", "account create --handle HANDLE --email EMAIL", "invite create", "request-crawl", "firehose events", "audit"} {
		require.Contains(t, out, c)
	}
	require.Empty(t, errOut)

	for _, bad := range [][]string{{"admin"}, {"admin", "account"}, {"admin", "account", "frob"}, {"admin", "account", "info"}, {"admin", "nope"}} {
		code, _, errOut := cli(bad...)
		require.Equal(t, 2, code, "%v", bad)
		require.Contains(t, errOut, "bulwark admin", "%v", bad)
	}
}

// TestAdminFirehoseCommands runs the firehose repairs against a running
// server with an account: each answers JSON that parses, and the event
// listing shows what they did.
func TestAdminFirehoseCommands(t *testing.T) {
	t.Parallel()
	s := startLiveServer(t, serverOptions{})
	var acct createdAccount
	s.adminJSON(t, &acct, "account", "create", "--handle", "dan", "--email", "dan@example.com")
	users := []testUser{{did: acct.DID}}
	last := s.sequenced(t, users)

	var emitted struct {
		DID string `json:"did"`
		Rev string `json:"rev"`
	}
	s.adminJSON(t, &emitted, "firehose", "emit-sync", "--did", acct.DID, "--reason", "test")
	require.Equal(t, acct.DID, emitted.DID)
	// The sequencer numbers the new #sync after it commits.
	ev := s.waitEvent(t, func(e firehoseEvent) bool { return e.Seq > last && e.Kind == "sync" })
	require.Equal(t, emitted.Rev, ev.Rev)

	var repaired struct {
		Seq     int64 `json:"seq"`
		Changed bool  `json:"changed"`
	}
	s.adminJSON(t, &repaired, "firehose", "invalidate", "--seq", fmt.Sprint(last))
	require.Equal(t, last, repaired.Seq)
	require.True(t, repaired.Changed)
	require.Regexp(t, fmt.Sprintf(`(?m)^%d\s.*invalidated$`, last), s.admin(t, "firehose", "events", "--from", fmt.Sprint(last)))

	var oversized struct {
		Repaired []json.RawMessage `json:"repaired"`
	}
	s.adminJSON(t, &oversized, "firehose", "repair-oversized")
	require.Empty(t, oversized.Repaired, "nothing here breaks a limit")
	var consumers struct {
		Consumers []json.RawMessage `json:"consumers"`
		Stuck     int               `json:"stuck"`
	}
	s.adminJSON(t, &consumers, "firehose", "consumers")
	require.Zero(t, consumers.Stuck)
}
