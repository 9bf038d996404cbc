package config

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/outbound"
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
	// DefaultProxyTotalTimeout bounds a whole proxied answer: an app
	// view's take well under a second.
	DefaultProxyTotalTimeout = 60 * time.Second
	// DefaultProxyMinRate is the slowest average rate of a proxied answer
	// that has taken 10 s: what uploads are held to.
	DefaultProxyMinRate = 8 << 10
	// DefaultProxyMaxPerClient caps one client's proxied requests in
	// flight: a Bluesky client loading its home screen makes about ten
	// at once.
	DefaultProxyMaxPerClient = 16
	// DefaultProxyMaxResponse bounds a proxied service's response body.
	DefaultProxyMaxResponse = 10 << 20
	// MinProxyMaxResponse is the smallest --proxy-max-response accepted:
	// an app view's ordinary answers are tens of kilobytes.
	MinProxyMaxResponse = 64 << 10
)

// validateProxy checks the services methods are proxied to and the
// proxy's limits. The app view's URL and DID are validateUpstreams'; that
// the server can reach it is checked here with the others'.
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
	for _, svc := range []struct{ name, url string }{
		{"appview-url", c.AppViewURL}, {"mod-service-url", c.ModServiceURL}, {"report-service-url", c.ReportServiceURL},
	} {
		if err := c.checkReachable(svc.url); err != nil {
			return settingError(svc.name, "%v", err)
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
	if c.ProxyTotalTimeout < c.ProxyHeaderTimeout {
		return settingError("proxy-total-timeout", "must be at least --proxy-header-timeout (%s)", c.ProxyHeaderTimeout)
	}
	if c.ProxyMinRate <= 0 {
		return settingError("proxy-min-rate", "must be positive")
	}
	if c.ProxyMaxPerClient < 1 {
		return settingError("proxy-max-per-client", "must be at least 1")
	}
	if c.ProxyMaxResponse < MinProxyMaxResponse {
		return settingError("proxy-max-response", "must be at least 64KiB")
	}
	return nil
}

// allowHint names the setting that lets outbound requests reach a
// private service.
const allowHint = "allow its network with --proxy-allow-private (BULWARK_PROXY_ALLOW_PRIVATE)"

// checkReachable refuses a configured service URL (an absolute http(s)
// URL, or empty) that the server's outbound requests could never reach:
// they dial only public addresses over https, and the networks
// --proxy-allow-private lists over http or https. A host given as an
// address or a localhost name is checked here; a name that resolves to a
// private address is refused when dialled, and the log says the same.
func (c *Config) checkReachable(raw string) error {
	u, err := url.Parse(raw)
	if raw == "" || err != nil {
		return nil
	}
	host := u.Hostname()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else if h := strings.ToLower(strings.TrimSuffix(host, ".")); h == "localhost" || strings.HasSuffix(h, ".localhost") {
		addrs = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}
	}
	if len(addrs) == 0 {
		if u.Scheme == "http" && len(c.ProxyAllowPrivate) == 0 {
			return fmt.Errorf("%s: outbound requests use plain http only to the networks --proxy-allow-private lists, and it lists none: use https, or %s", raw, allowHint)
		}
		return nil
	}
	for _, a := range addrs {
		for _, p := range c.ProxyAllowPrivate {
			if p.Contains(a) {
				return nil
			}
		}
		if outbound.IsPublic(a) && u.Scheme == "https" {
			return nil
		}
	}
	example := addrs[0].String() + "/32"
	if addrs[0].Is6() {
		example = addrs[0].String() + "/128"
	}
	if outbound.IsPublic(addrs[0]) {
		return fmt.Errorf("%s: outbound requests use plain http only to the networks --proxy-allow-private lists: use https, or %s (e.g. --proxy-allow-private %s)", raw, allowHint, example)
	}
	return fmt.Errorf("%s is a loopback or private address, which outbound requests do not reach: %s (e.g. --proxy-allow-private %s)", raw, allowHint, example)
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
