package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email/emailtest"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// smtpTestPassword is the mail server's AUTH password; no log line may
// hold it.
const smtpTestPassword = "smtp-sekrit-pw"

// TestServeSendsMail runs serve with --smtp-url: the Mailer's worker runs
// beside the server, a code requested over HTTP arrives at the mail server
// (which wants AUTH), and neither the SMTP password nor the code appears in
// the log.
//
// Not parallel: serve registers the rate limiters, the budget and the
// mailer with the process-wide metrics registry (TestServeProtection
// reads them).
func TestServeSendsMail(t *testing.T) {
	sink := emailtest.StartSMTP(t, emailtest.Options{User: "bulwark", Password: smtpTestPassword})
	plcSrv := httptest.NewServer(plctest.New())
	t.Cleanup(plcSrv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := []string{"serve", "--database-url", dbtest.NewURL(t), "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--plc-url", plcSrv.URL, "--handle-domains", ".test",
		"--smtp-url", sink.URL(), "--email-from", "Bulwark <noreply@pds.test>"}
	addr, done, logs := startServe(t, ctx, args)

	post := func(nsid, token string, in any) map[string]any { return postOK(t, "http://"+addr, nsid, token, in) }
	acct := post("com.atproto.server.createAccount", "", map[string]any{"handle": "alice.test", "email": "alice@example.com", "password": "alice password"})
	post("com.atproto.server.requestEmailConfirmation", acct["accessJwt"].(string), nil)
	var mail emailtest.Received
	select {
	case mail = <-sink.Mails():
	case <-time.After(waitLimit):
		t.Fatalf("no mail arrived; logs:\n%s", logs.String())
	}
	code := emailtest.Parse(t, mail).Code(t)
	post("com.atproto.server.confirmEmail", acct["accessJwt"].(string), map[string]any{"email": "alice@example.com", "token": code})

	cancel()
	select {
	case exit := <-done:
		require.Equal(t, 0, exit, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
	require.Contains(t, logs.String(), `smtp="smtp://bulwark:xxxxx@`, "the SMTP URL is logged with its password redacted")
	require.NotContains(t, logs.String(), smtpTestPassword)
	require.False(t, strings.Contains(logs.String(), code), "no code in the log")
}
