package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// mailSink is an SMTP server (emersion/go-smtp) that hands each mail it
// accepts to got.
type mailSink struct{ got chan []byte }

func (s *mailSink) NewSession(*smtp.Conn) (smtp.Session, error) { return &sinkSession{s}, nil }

type sinkSession struct{ s *mailSink }

// smtpTestPassword is the sink's AUTH password; no log line may hold it.
const smtpTestPassword = "smtp-sekrit-pw"

func (*sinkSession) AuthMechanisms() []string { return []string{sasl.Plain} }
func (*sinkSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != "bulwark" || pass != smtpTestPassword {
			return &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "bad credentials"}
		}
		return nil
	}), nil
}
func (*sinkSession) Mail(string, *smtp.MailOptions) error { return nil }
func (*sinkSession) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (ss *sinkSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err == nil {
		ss.s.got <- b
	}
	return err
}
func (*sinkSession) Reset()        {}
func (*sinkSession) Logout() error { return nil }

// TestServeSendsMail runs serve with --smtp-url: the Mailer's worker runs
// beside the server, a code requested over HTTP arrives at the mail server
// (which wants AUTH), and neither the SMTP password nor the code appears in
// the log.
//
// Not parallel: serve registers the rate limiters, the budget and the
// mailer with the process-wide metrics registry (TestServeProtection
// reads them).
func TestServeSendsMail(t *testing.T) {
	sink := &mailSink{got: make(chan []byte, 10)}
	srv := smtp.NewServer(sink)
	srv.Domain, srv.ErrorLog = "localhost", log.New(io.Discard, "", 0)
	srv.AllowInsecureAuth = true
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	plcSrv := httptest.NewServer(plctest.New())
	t.Cleanup(plcSrv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := []string{"serve", "--database-url", dbtest.NewURL(t), "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--plc-url", plcSrv.URL, "--handle-domains", ".test",
		"--smtp-url", "smtp://bulwark:" + smtpTestPassword + "@" + l.Addr().String() + "?tls=none", "--email-from", "Bulwark <noreply@pds.test>"}
	addr, done, logs := startServe(t, ctx, args)

	post := func(nsid, token string, in any) map[string]any {
		b, err := json.Marshal(in)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/xrpc/"+nsid, bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", nsid, body)
		var out map[string]any
		_ = json.Unmarshal(body, &out)
		return out
	}
	acct := post("com.atproto.server.createAccount", "", map[string]any{"handle": "alice.test", "email": "alice@example.com", "password": "alice password"})
	post("com.atproto.server.requestEmailConfirmation", acct["accessJwt"].(string), nil)
	var mail []byte
	select {
	case mail = <-sink.got:
	case <-time.After(waitLimit):
		t.Fatalf("no mail arrived; logs:\n%s", logs.String())
	}
	code := regexp.MustCompile(`[A-Z2-7]{5}-[A-Z2-7]{5}`).Find(mail)
	require.NotNil(t, code, "%s", mail)
	post("com.atproto.server.confirmEmail", acct["accessJwt"].(string), map[string]any{"email": "alice@example.com", "token": string(code)})

	cancel()
	select {
	case exit := <-done:
		require.Equal(t, 0, exit, logs.String())
	case <-time.After(waitLimit):
		t.Fatal("serve did not stop")
	}
	require.Contains(t, logs.String(), `smtp="smtp://bulwark:xxxxx@`, "the SMTP URL is logged with its password redacted")
	require.NotContains(t, logs.String(), smtpTestPassword)
	require.False(t, strings.Contains(logs.String(), string(code)), "no code in the log")
}
