package email

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// TLSMode is how the connection to the SMTP server is protected.
type TLSMode string

// TLS modes. An smtps:// URL means TLSImplicit, an smtp:// URL TLSStartTLS
// unless it says ?tls=none.
const (
	// TLSImplicit speaks TLS from the first byte (submissions port 465).
	TLSImplicit TLSMode = "implicit"
	// TLSStartTLS upgrades with STARTTLS before anything else is sent, and
	// gives up on a server that does not offer it: a password or a code is
	// never sent in the clear because a man in the middle hid the offer.
	TLSStartTLS TLSMode = "starttls"
	// TLSNone is plain text, allowed only to a loopback address (a local
	// relay or a test server).
	TLSNone TLSMode = "none"
)

// Default ports per scheme.
const (
	DefaultSMTPSPort = 465
	DefaultSMTPPort  = 587
)

// SMTPConfig is a parsed BULWARK_SMTP_URL. Build it with ParseSMTPURL. Its
// String, LogValue and GoString forms never show the password.
type SMTPConfig struct {
	// Host is the server's name or IP address (also the name its
	// certificate must carry).
	Host string
	// Port is the TCP port.
	Port int
	// Username is the SMTP AUTH user; empty means no authentication.
	Username string
	// TLS is how the connection is protected.
	TLS TLSMode

	password string
}

// ParseSMTPURL parses and checks an SMTP server URL:
//
//	smtps://user:pass@mail.example.com:465   implicit TLS (default port 465)
//	smtp://user:pass@mail.example.com:587    STARTTLS required (default port 587)
//	smtp://127.0.0.1:2525?tls=none           plain text, loopback hosts only
//
// User and password are percent-decoded and must come together. Errors
// wrap ErrInvalidSMTPURL and never quote the URL, which holds the password.
func ParseSMTPURL(raw string) (*SMTPConfig, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, fmt.Errorf("%w: empty", ErrInvalidSMTPURL)
	}
	if len(raw) > maxSMTPURL {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrInvalidSMTPURL, maxSMTPURL)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url's errors quote the input, password included.
		return nil, fmt.Errorf("%w: not a URL (percent-encode special characters in the user and password)", ErrInvalidSMTPURL)
	}
	c := &SMTPConfig{}
	switch strings.ToLower(u.Scheme) {
	case "smtps":
		c.TLS, c.Port = TLSImplicit, DefaultSMTPSPort
	case "smtp":
		c.TLS, c.Port = TLSStartTLS, DefaultSMTPPort
	default:
		return nil, fmt.Errorf("%w: scheme must be smtp or smtps", ErrInvalidSMTPURL)
	}
	if u.Opaque != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return nil, fmt.Errorf("%w: no path or fragment allowed", ErrInvalidSMTPURL)
	}
	c.Host = u.Hostname()
	if c.Host == "" {
		return nil, fmt.Errorf("%w: no host", ErrInvalidSMTPURL)
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("%w: port must be 1-65535", ErrInvalidSMTPURL)
		}
		c.Port = n
	}
	if u.User != nil {
		c.Username = u.User.Username()
		c.password, _ = u.User.Password()
		if c.Username == "" || c.password == "" {
			return nil, fmt.Errorf("%w: give both a user and a password, or neither", ErrInvalidSMTPURL)
		}
	}
	if err := c.parseQuery(u.RawQuery); err != nil {
		return nil, err
	}
	return c, nil
}

// maxSMTPURL bounds the setting (a URL is a host, a user and a password).
const maxSMTPURL = 2048

func (c *SMTPConfig) parseQuery(raw string) error {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return fmt.Errorf("%w: malformed query", ErrInvalidSMTPURL)
	}
	for k := range q {
		if k != "tls" {
			return fmt.Errorf("%w: unknown parameter %q (only tls)", ErrInvalidSMTPURL, k)
		}
	}
	v := q.Get("tls")
	switch {
	case v == "":
	case c.TLS == TLSImplicit:
		return fmt.Errorf("%w: smtps:// is always TLS; tls= is for smtp://", ErrInvalidSMTPURL)
	case v == string(TLSStartTLS):
	case v == string(TLSNone):
		if !isLoopback(c.Host) {
			return fmt.Errorf("%w: tls=none is only allowed to a loopback address", ErrInvalidSMTPURL)
		}
		c.TLS = TLSNone
	default:
		return fmt.Errorf("%w: tls must be starttls or none", ErrInvalidSMTPURL)
	}
	return nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// HasPassword reports whether the URL carried a password.
func (c SMTPConfig) HasPassword() bool { return c.password != "" }

// Addr is host:port.
func (c SMTPConfig) Addr() string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }

// String is the URL with the password replaced by "xxxxx", for logs and
// the effective configuration. (Value receivers: %v of a copy redacts too.)
func (c SMTPConfig) String() string {
	u := url.URL{Scheme: "smtp", Host: c.Addr()}
	if c.TLS == TLSImplicit {
		u.Scheme = "smtps"
	}
	if c.Username != "" {
		u.User = url.UserPassword(c.Username, "xxxxx")
	}
	if c.TLS == TLSNone {
		u.RawQuery = "tls=none"
	}
	return u.String()
}

// GoString keeps %#v from printing the password.
func (c SMTPConfig) GoString() string { return "email.SMTPConfig(" + c.String() + ")" }

// LogValue implements slog.LogValuer with the redacted URL.
func (c SMTPConfig) LogValue() slog.Value { return slog.StringValue(c.String()) }
