package outbound

import (
	"context"
	"net"
	"time"
)

// dnsDialTimeout bounds connecting to the DNS server (each lookup is
// bounded by its caller's context too).
const dnsDialTimeout = 5 * time.Second

// DNSResolver is a resolver that sends every question to the DNS server
// at addr (host:port) instead of the system's, over UDP or TCP as Go's
// resolver chooses: Config.Resolver for a server whose lookups must go to
// one chosen server (--dns-server).
func DNSResolver(addr string) *net.Resolver {
	d := net.Dialer{Timeout: dnsDialTimeout}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
}
