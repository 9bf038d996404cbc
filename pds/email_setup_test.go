package pds

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"mime"
	"mime/multipart"
	"net"
	"net/mail"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/emersion/go-smtp"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/email"
)

// Fixtures of the mail tests: a real SMTP server (emersion/go-smtp) in the
// test process that keeps what it is sent, a clock the Mailer reads, and
// helpers that take a code out of a mail or out of the held outbox.

// mailClock is a settable time source for a Mailer (code lifetimes, retry
// schedules).
type mailClock struct {
	mu sync.Mutex
	t  time.Time
}

func newMailClock() *mailClock { return &mailClock{t: time.Now()} }

func (c *mailClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *mailClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// gotMail is one mail the test server accepted.
type gotMail struct {
	To   []string
	Data []byte
}

// smtpSink is an SMTP server on a loopback port (plain text, no AUTH: the
// Mailer is pointed at it with smtp://addr?tls=none).
type smtpSink struct {
	Addr string
	got  chan gotMail
	srv  *smtp.Server
}

// startSMTPSink serves on addr ("" = a free port) until the test ends or
// Close.
func startSMTPSink(t testing.TB, addr string) *smtpSink {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s := &smtpSink{got: make(chan gotMail, 100)}
	s.srv = smtp.NewServer(s)
	s.srv.Domain = "localhost"
	s.srv.ErrorLog = log.New(io.Discard, "", 0)
	s.srv.ReadTimeout, s.srv.WriteTimeout = 30*time.Second, 30*time.Second
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	s.Addr = l.Addr().String()
	go func() { _ = s.srv.Serve(l) }()
	t.Cleanup(func() { _ = s.srv.Close() })
	return s
}

// URL is the BULWARK_SMTP_URL of the sink.
func (s *smtpSink) URL() string { return "smtp://" + s.Addr + "?tls=none" }

// NewSession implements smtp.Backend.
func (s *smtpSink) NewSession(*smtp.Conn) (smtp.Session, error) { return &sinkSession{sink: s}, nil }

type sinkSession struct {
	sink *smtpSink
	cur  gotMail
}

func (ss *sinkSession) Mail(string, *smtp.MailOptions) error { ss.cur = gotMail{}; return nil }
func (ss *sinkSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.cur.To = append(ss.cur.To, to)
	return nil
}
func (ss *sinkSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	ss.cur.Data = b
	ss.sink.got <- ss.cur
	return nil
}
func (ss *sinkSession) Reset()        { ss.cur = gotMail{} }
func (ss *sinkSession) Logout() error { return nil }

// next waits for the next mail. The bound is generous: the mail arrives or
// the test fails; it is not a timing assertion.
func (s *smtpSink) next(t testing.TB) gotMail {
	t.Helper()
	select {
	case m := <-s.got:
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no mail arrived")
		return gotMail{}
	}
}

// none checks that nothing has arrived so far.
func (s *smtpSink) none(t testing.TB) {
	t.Helper()
	select {
	case m := <-s.got:
		t.Fatalf("unexpected mail to %v", m.To)
	default:
	}
}

var mailCodeRE = regexp.MustCompile(`[A-Z2-7]{5}-[A-Z2-7]{5}`)

// mailText is the plain-text part of a multipart/alternative mail, and
// its subject.
func mailText(t testing.TB, m gotMail) (subject, text string) {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
	require.NoError(t, err)
	subject, err = new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
	require.NoError(t, err)
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	require.NoError(t, err)
	require.Equal(t, "multipart/alternative", mt)
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		body, err := io.ReadAll(part)
		require.NoError(t, err)
		if strings.HasPrefix(part.Header.Get("Content-Type"), "text/plain") {
			text = string(body)
		}
	}
	return subject, text
}

// codeIn is the code a mail carries.
func codeIn(t testing.TB, m gotMail) string {
	t.Helper()
	_, text := mailText(t, m)
	c := mailCodeRE.FindString(text)
	require.NotEmpty(t, c, "no code in %q", text)
	return c
}

// mailEnv is an accountEnv whose Mailer sends to sink (nil: no SMTP, mail
// is held) on clock.
type mailEnv struct {
	*accountEnv
	clock *mailClock
	logs  *lockedBuffer
}

// newMailEnv builds it. worker runs the Mailer's worker as serve does;
// without it the test calls Deliver itself. opts adjusts the rest.
func newMailEnv(t testing.TB, smtpURL string, worker bool, opts envOptions) *mailEnv {
	t.Helper()
	clock := newMailClock()
	logs := &lockedBuffer{}
	cfg := &email.Config{From: "Bulwark <noreply@pds.test>", Now: clock.Now, SendTimeout: 10 * time.Second}
	if smtpURL != "" {
		sc, err := email.ParseSMTPURL(smtpURL)
		require.NoError(t, err)
		cfg.SMTP = sc
	}
	opts.mail = cfg
	opts.logs = logs
	e := &mailEnv{accountEnv: newAccountEnv(t, opts), clock: clock, logs: logs}
	if worker {
		m := e.accounts.Mail()
		require.NoError(t, m.Start(context.Background()))
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
	}
	return e
}

// deliver runs one round of the Mailer's worker and returns how many mails
// went out.
func (e *mailEnv) deliver(t testing.TB) int {
	t.Helper()
	n, err := e.accounts.Mail().Deliver(context.Background())
	require.NoError(t, err)
	return n
}

// heldCode is did's code for purpose, read from the outbox (mail not
// sent), or "".
func (e *accountEnv) heldCode(t testing.TB, did syntax.DID, purpose email.Purpose) string {
	t.Helper()
	pending, err := e.accounts.PendingEmailTokens(context.Background(), did)
	require.NoError(t, err)
	for _, p := range pending {
		if p.Purpose == purpose {
			return p.Code
		}
	}
	return ""
}

// deleteOwnAccount deletes u's account as its holder does: a
// delete_account code (read from the held outbox), then deleteAccount.
func (e *accountEnv) deleteOwnAccount(t testing.TB, u *user) xrpcResult {
	t.Helper()
	e.post(t, "com.atproto.server.requestAccountDelete", u.access, nil).ok(t)
	code := e.heldCode(t, u.did, email.PurposeDeleteAccount)
	require.NotEmpty(t, code)
	return e.post(t, "com.atproto.server.deleteAccount", "", map[string]any{"did": u.did, "password": u.pass, "token": code})
}
