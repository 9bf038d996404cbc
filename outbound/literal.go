package outbound

import (
	"net/netip"
	"net/url"
	"strings"
)

// LiteralHosts are the networks of the URLs whose host is an IP address
// (that address) or localhost (loopback), for Config.AllowCIDRs of a
// client that calls endpoints the operator configured (relays, a
// webhook): one on the operator's own network works when the setting
// names it so, and naming a host that resolves to a private address does
// not open the client to it. A URL without a scheme is read as https.
func LiteralHosts(urls []string) []netip.Prefix {
	var out []netip.Prefix
	for _, raw := range urls {
		if raw == "" {
			continue
		}
		if !strings.Contains(raw, "://") {
			raw = "https://" + raw
		}
		u, err := url.Parse(raw)
		if err != nil {
			continue
		}
		host := u.Hostname()
		if strings.EqualFold(host, "localhost") {
			out = append(out, netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"))
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return out
}
