package plc

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// ErrInsecureEndpoint means an operation would publish a plain-http PDS
// endpoint in a public PLC directory. Such a DID would point the whole
// network at an address only this machine can reach, and a PLC operation
// cannot be taken back, so nothing is signed for it or sent.
var ErrInsecureEndpoint = errors.New("a public PLC directory must not get an http:// PDS endpoint")

// IsLocalHost reports whether host (a name or address, without a port)
// names this machine or a private network: localhost, *.localhost, *.test,
// or a loopback, private or link-local address. Nobody else can reach such
// a host, so it is where development servers and directories live.
func IsLocalHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "localhost" || strings.HasSuffix(h, ".localhost") || strings.HasSuffix(h, ".test") {
		return true
	}
	if ip, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		ip = ip.Unmap()
		return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast()
	}
	return false
}

// IsPublicDirectory reports whether the directory at rawURL is one other
// machines resolve DIDs from: any host IsLocalHost does not call local.
// A URL that does not parse counts as public.
func IsPublicDirectory(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return true
	}
	return !IsLocalHost(u.Hostname())
}

// CheckEndpoint refuses (ErrInsecureEndpoint) a PDS endpoint that is not
// https when the directory at directoryURL is public. Every operation this
// package builds or submits passes through it; config validation calls it
// too, so that a server so configured does not start.
func CheckEndpoint(directoryURL, pdsEndpoint string) error {
	if !IsPublicDirectory(directoryURL) {
		return nil
	}
	u, err := url.Parse(pdsEndpoint)
	if err != nil || u.Scheme != "https" {
		return fmt.Errorf("%w: %s would be published in %s", ErrInsecureEndpoint, pdsEndpoint, directoryURL)
	}
	return nil
}
