// Package emailtest is a real SMTP server (emersion/go-smtp) that tests run
// in their own process, and the helpers that take apart what it receives.
//
//	srv := emailtest.StartSMTP(t, emailtest.Options{})
//	// point the Mailer at srv.URL() ...
//	mail := emailtest.Parse(t, srv.Next(t))
//	code := mail.Code(t)
package emailtest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"math/big"
	"mime"
	"mime/multipart"
	"net"
	"net/mail"
	"net/url"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/stretchr/testify/require"
)

// waitMail bounds Next: the mail arrives or the test fails. It is not a
// timing assertion.
const waitMail = 30 * time.Second

// TLSMode is how the server speaks TLS.
type TLSMode int

// TLS modes.
const (
	// Plain is no TLS at all.
	Plain TLSMode = iota
	// StartTLS offers STARTTLS on a plain connection.
	StartTLS
	// Implicit speaks TLS from the first byte.
	Implicit
)

// Options configure a server. The zero value is a plain-text server on a
// free loopback port that accepts any mail without AUTH.
type Options struct {
	// Addr is where to listen ("" = a free loopback port).
	Addr string
	// TLS is how the server speaks TLS; StartTLS and Implicit need Cert.
	TLS TLSMode
	// Cert is the server's certificate (see SelfSigned).
	Cert *tls.Certificate
	// User and Password, when User is set, are the one AUTH PLAIN login
	// the server accepts, and it refuses MAIL FROM before a login. Without
	// User it offers no AUTH.
	User, Password string
	// RejectRcpt makes RCPT TO this address fail with 550.
	RejectRcpt string
	// InData, when set, receives a channel as each message's DATA begins;
	// the server accepts the message once that channel is closed.
	InData chan chan struct{}
}

// Received is one mail the server accepted.
type Received struct {
	From string
	To   []string
	Data []byte
	// User is the AUTH user ("" without AUTH).
	User string
	// TLS says whether the mail came over TLS.
	TLS bool
}

// Server is a running SMTP server that keeps what it receives.
type Server struct {
	// Addr is the address it listens on.
	Addr  string
	opts  Options
	got   chan Received
	auths atomic.Int64
}

// StartSMTP serves until the test ends.
func StartSMTP(t testing.TB, opts Options) *Server {
	t.Helper()
	s := &Server{opts: opts, got: make(chan Received, 100)}
	srv := smtp.NewServer(s)
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = opts.TLS == Plain
	srv.ErrorLog = log.New(io.Discard, "", 0)
	srv.ReadTimeout, srv.WriteTimeout = 30*time.Second, 30*time.Second
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var l net.Listener
	var err error
	switch opts.TLS {
	case Implicit:
		l, err = tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{*opts.Cert}})
	case StartTLS:
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*opts.Cert}}
		l, err = net.Listen("tcp", addr)
	default:
		l, err = net.Listen("tcp", addr)
	}
	require.NoError(t, err)
	s.Addr = l.Addr().String()
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// URL is an smtp:// URL (plain text, tls=none) for the server, with its
// login when it has one: what BULWARK_SMTP_URL would say.
func (s *Server) URL() string {
	u := url.URL{Scheme: "smtp", Host: s.Addr, RawQuery: "tls=none"}
	if s.opts.User != "" {
		u.User = url.UserPassword(s.opts.User, s.opts.Password)
	}
	return u.String()
}

// Mails delivers each mail as the server accepts it.
func (s *Server) Mails() <-chan Received { return s.got }

// Next waits for the next mail.
func (s *Server) Next(t testing.TB) Received {
	t.Helper()
	select {
	case r := <-s.got:
		return r
	case <-time.After(waitMail):
		t.Fatal("no mail arrived")
		return Received{}
	}
}

// None checks that no mail has arrived so far.
func (s *Server) None(t testing.TB) {
	t.Helper()
	select {
	case r := <-s.got:
		t.Fatalf("unexpected mail to %v", r.To)
	default:
	}
}

// Auths counts the AUTH attempts the server has seen.
func (s *Server) Auths() int64 { return s.auths.Load() }

// NewSession implements smtp.Backend.
func (s *Server) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{srv: s, conn: c}, nil
}

type session struct {
	srv  *Server
	conn *smtp.Conn
	user string
	cur  Received
}

func (s *session) AuthMechanisms() []string {
	if s.srv.opts.User == "" {
		return nil
	}
	return []string{sasl.Plain}
}

func (s *session) Auth(string) (sasl.Server, error) {
	s.srv.auths.Add(1)
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if user != s.srv.opts.User || pass != s.srv.opts.Password {
			return &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "bad credentials"}
		}
		s.user = user
		return nil
	}), nil
}

func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	if s.srv.opts.User != "" && s.user == "" {
		return smtp.ErrAuthRequired
	}
	s.cur = Received{From: from, User: s.user}
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if to == s.srv.opts.RejectRcpt && to != "" {
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
	if s.srv.opts.InData != nil {
		proceed := make(chan struct{})
		s.srv.opts.InData <- proceed
		<-proceed
	}
	s.srv.got <- s.cur
	return nil
}

func (s *session) Reset()        { s.cur = Received{User: s.user} }
func (s *session) Logout() error { return nil }

// Mail is a received multipart/alternative mail taken apart.
type Mail struct {
	Subject string
	Header  mail.Header
	// Text and HTML are the decoded parts, with CRLF line ends made LF.
	Text string
	HTML string
}

// CodeRE matches a one-time code, "XXXXX-XXXXX".
var CodeRE = regexp.MustCompile(`[A-Z2-7]{5}-[A-Z2-7]{5}`)

// Code is the code in the plain-text part.
func (m Mail) Code(t testing.TB) string {
	t.Helper()
	c := CodeRE.FindString(m.Text)
	require.NotEmpty(t, c, "no code in %q", m.Text)
	return c
}

// Parse reads a multipart/alternative mail (a text/plain and a text/html
// part) into its parts.
func Parse(t testing.TB, r Received) Mail {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(r.Data))
	require.NoError(t, err)
	var m Mail
	m.Header = msg.Header
	m.Subject, err = new(mime.WordDecoder).DecodeHeader(msg.Header.Get("Subject"))
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
			m.Text = string(body)
		case "text/html":
			m.HTML = string(body)
		default:
			t.Fatalf("unexpected part %s", ct)
		}
	}
	return m
}

// SelfSigned makes a certificate for 127.0.0.1 and localhost, and a pool
// that trusts it.
func SelfSigned(t testing.TB) (*tls.Certificate, *x509.CertPool) {
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

// FreeAddr returns a loopback address nothing listens on yet, for a server
// that starts after the Mailer has tried it.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
