package config

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Service proxying defaults: the reference PDS installer's.
const (
	// DefaultModServiceURL is Bluesky's moderation service.
	DefaultModServiceURL = "https://mod.bsky.app"
	// DefaultModServiceDID is the service DID of DefaultModServiceURL.
	DefaultModServiceDID = "did:plc:ar7c4by46qjdydhdevvrndac"
	// DefaultReportServiceURL receives reports; Bluesky's moderation
	// service, as in the reference installer.
	DefaultReportServiceURL = DefaultModServiceURL
	// DefaultReportServiceDID is the service DID of
	// DefaultReportServiceURL.
	DefaultReportServiceDID = DefaultModServiceDID
	// DefaultProxyHeaderTimeout bounds the wait for a proxied service's
	// response headers.
	DefaultProxyHeaderTimeout = 10 * time.Second
	// DefaultProxyBodyTimeout bounds each wait for more of a proxied
	// service's response body.
	DefaultProxyBodyTimeout = 30 * time.Second
	// DefaultProxyMaxResponse bounds a proxied service's response body.
	DefaultProxyMaxResponse = 10 << 20
	// MinProxyMaxResponse is the smallest --proxy-max-response accepted:
	// an app view's ordinary answers are tens of kilobytes.
	MinProxyMaxResponse = 64 << 10
)

// validateProxy checks the services methods are proxied to and the
// proxy's limits. The app view is validateUpstreams'.
func (c *Config) validateProxy() error {
	for _, svc := range []struct{ name, url, did string }{
		{"mod-service", c.ModServiceURL, c.ModServiceDID},
		{"report-service", c.ReportServiceURL, c.ReportServiceDID},
	} {
		if (svc.url == "") != (svc.did == "") {
			return settingError(svc.name+"-url", "--%s-url and --%s-did are set together or not at all", svc.name, svc.name)
		}
		if svc.url == "" {
			continue
		}
		if err := checkURL(svc.url); err != nil {
			return settingError(svc.name+"-url", "%v", err)
		}
		if _, err := syntax.ParseDID(svc.did); err != nil {
			return settingError(svc.name+"-did", "%v", err)
		}
	}
	if c.DNSServer != "" {
		addr, err := ParseDNSServer(c.DNSServer)
		if err != nil {
			return settingError("dns-server", "%v", err)
		}
		c.DNSServer = addr
	}
	if c.ProxyHeaderTimeout <= 0 {
		return settingError("proxy-header-timeout", "must be positive")
	}
	if c.ProxyBodyTimeout <= 0 {
		return settingError("proxy-body-timeout", "must be positive")
	}
	if c.ProxyMaxResponse < MinProxyMaxResponse {
		return settingError("proxy-max-response", "must be at least 64KiB")
	}
	return nil
}

// ParseDNSServer reads --dns-server: an IP address, with a port or not
// (53), returned as "ip:port".
func ParseDNSServer(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if ap, err := netip.ParseAddrPort(raw); err == nil {
		return ap.String(), nil
	}
	a, err := netip.ParseAddr(strings.Trim(raw, "[]"))
	if err != nil {
		return "", fmt.Errorf("%q is not an IP address or ip:port", raw)
	}
	return netip.AddrPortFrom(a, 53).String(), nil
}
