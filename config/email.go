package config

import (
	"net/mail"
	"os"
	"strings"

	"github.com/bulwark-pds/bulwark/email"
)

// SMTP returns the parsed SMTPURL, or nil when none is set.
func (c *Config) SMTP() (*email.SMTPConfig, error) {
	if c.SMTPURL == "" {
		return nil, nil
	}
	return email.ParseSMTPURL(c.SMTPURL)
}

// validateEmail checks the mail server, the sender and the template
// directory. Template files themselves are checked when the server starts
// (email.New renders each once).
func (c *Config) validateEmail() error {
	if c.SMTPURL != "" {
		// ParseSMTPURL's errors never quote the URL (it holds a password).
		if _, err := c.SMTP(); err != nil {
			return settingError("smtp-url", "%v", err)
		}
		if c.EmailFrom == "" {
			return settingError("email-from", "a sender address is required with --smtp-url")
		}
	}
	if c.EmailFrom != "" {
		if a, err := mail.ParseAddress(c.EmailFrom); err != nil || !strings.Contains(a.Address, "@") {
			return settingError("email-from", "%q is not an address like 'Example PDS <noreply@example.com>'", c.EmailFrom)
		}
	}
	if c.EmailTemplates != "" {
		st, err := os.Stat(c.EmailTemplates)
		if err != nil {
			return settingError("email-templates", "%v", err)
		}
		if !st.IsDir() {
			return settingError("email-templates", "%s is not a directory", c.EmailTemplates)
		}
	}
	return nil
}

// RedactSMTPURL is an SMTP URL without its password, for logs: the
// parsed URL's own redacted form, or RedactedText for one that does not
// parse (it may still hold a password).
func RedactSMTPURL(s string) string {
	if s == "" {
		return ""
	}
	sc, err := email.ParseSMTPURL(s)
	if err != nil {
		return RedactedText
	}
	return sc.String()
}

// smtpURLValue shows an SMTP URL without its password (--help prints
// defaults, which come from the environment).
type smtpURLValue string

func (v *smtpURLValue) String() string {
	if v == nil {
		return ""
	}
	return RedactSMTPURL(string(*v))
}

func (v *smtpURLValue) Set(s string) error {
	*v = smtpURLValue(strings.TrimSpace(s))
	return nil
}
