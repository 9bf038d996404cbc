package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"unicode/utf8"
)

// MinAdminPasswordLen is the shortest admin password accepted, in
// characters. The admin password guards every account, and the admin
// methods are reachable by anyone who can reach the server; the generated
// one is 48 hex digits.
const MinAdminPasswordLen = 16

// DefaultListMaxBytes is the record bytes one listRecords page holds at
// most: a hundred ordinary records are a few hundred kilobytes, while a
// hundred of the largest allowed would be a hundred megabytes of JSON.
const DefaultListMaxBytes = 4 << 20

// MinListMaxBytes is the smallest --list-max-bytes accepted: one record of
// the largest size the protocol allows, so that every record fits a page.
const MinListMaxBytes = 1 << 20

// checkAdminPassword applies the admin password rules.
func checkAdminPassword(pw string) error {
	if strings.TrimSpace(pw) != pw {
		return errors.New("must not begin or end with white space")
	}
	if n := utf8.RuneCountInString(pw); n < MinAdminPasswordLen {
		return fmt.Errorf("must be at least %d characters long (got %d); leave it unset to have one generated into <data-dir>/%s", MinAdminPasswordLen, n, SecretsDir)
	}
	return nil
}

// validateProtect checks the settings that bound what clients can make
// the server do: the networks outbound requests may reach, and the size
// of record pages.
func (c *Config) validateProtect() error {
	for _, p := range c.ProxyAllowPrivate {
		if p.Bits() == 0 {
			return settingError("proxy-allow-private", "%s would allow every address: list only the private networks the server must reach", p)
		}
	}
	if c.DNSServer != "" {
		host, port, err := net.SplitHostPort(c.DNSServer)
		if _, perr := netip.ParseAddr(host); err != nil || perr != nil || port == "" {
			return settingError("dns-server", "must be an IP address and port, like 127.0.0.1:53 or [::1]:53")
		}
	}
	if c.ListMaxBytes < MinListMaxBytes {
		return settingError("list-max-bytes", "must be at least 1MiB (one record of the largest size)")
	}
	return nil
}
