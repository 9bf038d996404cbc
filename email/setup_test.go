package email_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"mime"
	"mime/multipart"
	"net"
	"net/mail"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/email"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const (
	smtpUser = "bulwark"
	// smtpPass is the SMTP password every test uses; no log line may
	// contain it.
	smtpPass = "s3cret-Pa55word-never-logged"
)

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock {
	return &clock{t: time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logBuffer collects a logger's output for inspection.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// received is one mail the test server accepted.
type received struct {
	From string
	To   []string
	Data []byte
	User string // AUTH user ("" without AUTH)
	TLS  bool
}

// smtpServer is a real SMTP server (emersion/go-smtp) on a loopback port
// that keeps what it receives.
type smtpServer struct {
	Addr string
	srv  *smtp.Server
	got  chan received
	// rejectRcpt makes RCPT TO this address fail with 550.
	rejectRcpt string
	// inData, when set, receives a channel as each message's DATA begins;
	// the server accepts the message once it is closed.
	inData chan chan struct{}
	auths  atomic.Int64 // AUTH attempts
}

type serverTLS int

const (
	plainServer    serverTLS = iota // no TLS at all
	startTLSServer                  // offers STARTTLS
	implicitServer                  // TLS from the first byte
)

// startSMTP serves on addr ("" = a free loopback port) until the test
// ends. opts set the server's fields before it accepts connections.
func startSMTP(t testing.TB, addr string, mode serverTLS, cert *tls.Certificate, opts ...func(*smtpServer)) *smtpServer {
	t.Helper()
	s := &smtpServer{got: make(chan received, 100)}
	for _, o := range opts {
		o(s)
	}
	srv := smtp.NewServer(s)
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = mode == plainServer
	srv.ErrorLog = log.New(io.Discard, "", 0)
	srv.ReadTimeout, srv.WriteTimeout = 30*time.Second, 30*time.Second
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l net.Listener
	var err error
	switch mode {
	case implicitServer:
		l, err = tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{*cert}})
	case startTLSServer:
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}}
		l, err = net.Listen("tcp", addr)
	default:
		l, err = net.Listen("tcp", addr)
	}
	require.NoError(t, err)
	s.Addr, s.srv = l.Addr().String(), srv
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// NewSession implements smtp.Backend.
func (s *smtpServer) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{srv: s, conn: c}, nil
}

type session struct {
	srv  *smtpServer
	conn *smtp.Conn
	user string
	cur  received
}

func (s *session) AuthMechanisms() []string { return []string{sasl.Plain} }

func (s *session) Auth(string) (sasl.Server, error) {
	s.srv.auths.Add(1)
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != smtpUser || pass != smtpPass {
			return &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "bad credentials"}
		}
		s.user = user
		return nil
	}), nil
}

func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if s.user == "" {
		return smtp.ErrAuthRequired
	}
	s.cur = received{From: from, User: s.user}
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if to == s.srv.rejectRcpt {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such mailbox"}
	}
	s.cur.To = append(s.cur.To, to)
	return nil
}

func (s *session) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.cur.Data = b
	_, s.cur.TLS = s.conn.TLSConnectionState()
	if s.srv.inData != nil {
		proceed := make(chan struct{})
		s.srv.inData <- proceed
		<-proceed
	}
	s.srv.got <- s.cur
	return nil
}

func (s *session) Reset()        { s.cur = received{User: s.user} }
func (s *session) Logout() error { return nil }

// next waits for the next mail (a generous bound: it arrives or the test fails).
func (s *smtpServer) next(t testing.TB) received {
	t.Helper()
	select {
	case r := <-s.got:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no mail arrived")
		return received{}
	}
}

// none checks that nothing has arrived.
func (s *smtpServer) none(t testing.TB) {
	t.Helper()
	select {
	case r := <-s.got:
		t.Fatalf("unexpected mail to %v", r.To)
	default:
	}
}

// freeAddr returns a loopback address nothing listens on (yet).
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// selfSigned makes a certificate for 127.0.0.1 and localhost, and a pool
// that trusts it.
func selfSigned(t testing.TB) (*tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// env is one test's database, clock, logs and metrics.
type env struct {
	pool  *pgxpool.Pool
	clock *clock
	logs  *logBuffer
	reg   *prometheus.Registry
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return &env{pool: dbtest.New(t), clock: newClock(), logs: &logBuffer{}, reg: prometheus.NewRegistry()}
}

// config is a Config for this env; smtpURL "" means no SMTP.
func (e *env) config(t testing.TB, smtpURL string) email.Config {
	t.Helper()
	cfg := email.Config{
		From:        "Bulwark <noreply@pds.test>",
		Hostname:    "pds.test",
		Now:         e.clock.Now,
		Logger:      slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SendTimeout: 10 * time.Second,
	}
	if smtpURL != "" {
		c, err := email.ParseSMTPURL(smtpURL)
		require.NoError(t, err)
		cfg.SMTP = c
	}
	return cfg
}

// mailer builds a Mailer (registering its metrics with e.reg).
func (e *env) mailer(t testing.TB, cfg email.Config) *email.Mailer {
	t.Helper()
	cfg.Registerer = e.reg
	m, err := email.New(e.pool, cfg)
	require.NoError(t, err)
	return m
}

// plainURL is the URL of a plain-text loopback server with the test login.
func plainURL(addr string) string {
	return fmt.Sprintf("smtp://%s:%s@%s?tls=none", smtpUser, smtpPass, addr)
}

var accountSeq atomic.Int64

// account inserts an account row and returns its DID.
func (e *env) account(t testing.TB) syntax.DID {
	t.Helper()
	n := accountSeq.Add(1)
	did := syntax.DID(fmt.Sprintf("did:plc:mail%020d", n))
	_, err := e.pool.Exec(context.Background(),
		`INSERT INTO accounts (did, handle, email, password_hash, signing_key) VALUES ($1, $2, $3, 'x', '\x00')`,
		did.String(), fmt.Sprintf("user%d.pds.test", n), fmt.Sprintf("user%d@example.com", n))
	require.NoError(t, err)
	return did
}

// sendToken runs SendToken in a transaction of its own and commits it.
func (e *env) sendToken(t testing.TB, m *email.Mailer, did syntax.DID, purpose email.Purpose) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, m.SendToken(ctx, tx, did, "owner@example.com", purpose, email.TokenData{Handle: "alice.pds.test"}))
	require.NoError(t, tx.Commit(ctx))
}

// consume runs Consume in a transaction, committed on success.
func (e *env) consume(t testing.TB, m *email.Mailer, did syntax.DID, purpose email.Purpose, code string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if err := m.Consume(ctx, tx, did, purpose, code); err != nil {
		return err
	}
	require.NoError(t, tx.Commit(ctx))
	return nil
}

// state returns the outbox states in id order.
func (e *env) states(t testing.TB) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT state FROM email_outbox ORDER BY id`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// parsed is a received mail taken apart.
type parsed struct {
	Subject string
	Header  mail.Header
	Text    string
	HTML    string
}

var codeRE = regexp.MustCompile(`[A-Z2-7]{5}-[A-Z2-7]{5}`)

// Code is the code in the plain-text part.
func (p parsed) Code(t testing.TB) string {
	t.Helper()
	c := codeRE.FindString(p.Text)
	require.NotEmpty(t, c, "no code in %q", p.Text)
	return c
}

// parse reads a multipart/alternative mail into its parts.
func parse(t testing.TB, r received) parsed {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(r.Data))
	require.NoError(t, err)
	var p parsed
	p.Header = msg.Header
	p.Subject, err = new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
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
		body, err := io.ReadAll(part) // quoted-printable is decoded by NextPart
		require.NoError(t, err)
		body = bytes.ReplaceAll(body, []byte("\r\n"), []byte("\n"))
		ct, _, err := mime.ParseMediaType(part.Header.Get("Content-Type"))
		require.NoError(t, err)
		switch ct {
		case "text/plain":
			p.Text = string(body)
		case "text/html":
			p.HTML = string(body)
		default:
			t.Fatalf("unexpected part %s", ct)
		}
	}
	return p
}

func mustContainNone(t testing.TB, haystack string, needles ...string) {
	t.Helper()
	for _, n := range needles {
		require.False(t, strings.Contains(haystack, n), "found %q", n)
	}
}
