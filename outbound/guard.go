package outbound

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// maxDialAddrs bounds how many of a name's addresses one dial tries, so a
// name with hundreds of records cannot hold a request for hundreds of
// connection timeouts.
const maxDialAddrs = 4

// dialTimeout bounds one TCP connection attempt.
const dialTimeout = 5 * time.Second

// Special-purpose IPv4 ranges (IANA IPv4 Special-Purpose Address Registry,
// plus multicast and the reserved class E) that are never dialled unless
// Config.AllowCIDRs names them.
var blockedV4 = mustPrefixes(
	"0.0.0.0/8",       // "this network" (RFC 791); 0.0.0.0 reaches the local host
	"10.0.0.0/8",      // private (RFC 1918)
	"100.64.0.0/10",   // shared address space, carrier-grade NAT (RFC 6598)
	"127.0.0.0/8",     // loopback (RFC 1122)
	"169.254.0.0/16",  // link-local, cloud metadata services (RFC 3927)
	"172.16.0.0/12",   // private (RFC 1918)
	"192.0.0.0/24",    // IETF protocol assignments (RFC 6890)
	"192.0.2.0/24",    // documentation TEST-NET-1 (RFC 5737)
	"192.88.99.0/24",  // deprecated 6to4 relay anycast (RFC 7526)
	"192.168.0.0/16",  // private (RFC 1918)
	"198.18.0.0/15",   // benchmarking (RFC 2544)
	"198.51.100.0/24", // documentation TEST-NET-2 (RFC 5737)
	"203.0.113.0/24",  // documentation TEST-NET-3 (RFC 5737)
	"224.0.0.0/4",     // multicast (RFC 5771)
	"240.0.0.0/4",     // reserved class E, and 255.255.255.255 broadcast (RFC 1112, RFC 919)
)

// globalUnicastV6 is the only IPv6 block with public unicast addresses
// today (RFC 4291 §2.4); everything outside it is refused, which covers
// :: and ::1, IPv4-compatible ::/96, discard-only 100::/64, local-use NAT64
// 64:ff9b:1::/48, SRv6 5f00::/16, unique-local fc00::/7, link-local
// fe80::/10, site-local fec0::/10 and multicast ff00::/8.
var globalUnicastV6 = netip.MustParsePrefix("2000::/3")

// Special-purpose blocks inside 2000::/3 that are refused as well.
var blockedV6 = mustPrefixes(
	"2001::/23",     // IETF protocol assignments: Teredo, benchmarking, ORCHID (RFC 2928, 4380, 5180, 7343)
	"2001:db8::/32", // documentation (RFC 3849)
	"2002::/16",     // 6to4, deprecated (RFC 7526); embeds arbitrary IPv4 addresses
	"3fff::/20",     // documentation (RFC 9637)
)

// nat64 is the NAT64 well-known prefix (RFC 6052): its addresses stand for
// the IPv4 address in their last 32 bits and are judged as that address,
// so an IPv6-only host behind DNS64 reaches public IPv4 services while
// 64:ff9b::127.0.0.1 is refused like 127.0.0.1.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

func mustPrefixes(ss ...string) []netip.Prefix {
	ps := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		ps[i] = netip.MustParsePrefix(s)
	}
	return ps
}

// IsPublic reports whether addr is a public unicast address: one that is
// not loopback, private, link-local, unspecified, multicast, broadcast,
// carrier-grade NAT, documentation, benchmarking or otherwise reserved.
// IPv4-mapped IPv6 (::ffff:a.b.c.d) and NAT64 (64:ff9b::a.b.c.d) addresses
// are judged by the IPv4 address they carry.
func IsPublic(addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	addr = addr.WithZone("")
	if addr.Is4In6() {
		addr = addr.Unmap()
	} else if nat64.Contains(addr) {
		b := addr.As16()
		addr = netip.AddrFrom4([4]byte(b[12:]))
	}
	if addr.Is4() {
		return !inAny(blockedV4, addr)
	}
	return globalUnicastV6.Contains(addr) && !inAny(blockedV6, addr)
}

func inAny(ps []netip.Prefix, addr netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// guard dials only addresses it permits: after resolving a name, it drops
// every address it may not reach and connects to one of the others by IP,
// so a DNS answer that changes between a check and the connection (DNS
// rebinding) cannot slip past it. The dialer's Control hook checks the
// socket's address once more just before connect.
type guard struct {
	allow    []netip.Prefix
	public   bool  // public unicast addresses are permitted (https); false for plain http
	refusal  error // the sentinel a refusal wraps
	resolver Resolver
	log      *slog.Logger
	dialer   net.Dialer
	// ports replaces the port of a "host:port" dial target; tests use it
	// to reach local servers for https://name/ URLs. Nil in production.
	ports map[string]string
}

func newGuard(allow []netip.Prefix, public bool, refusal error, r Resolver, log *slog.Logger, ports map[string]string) *guard {
	g := &guard{allow: allow, public: public, refusal: refusal, resolver: r, log: log, ports: ports}
	g.dialer = net.Dialer{
		Timeout:   dialTimeout,
		KeepAlive: 30 * time.Second,
		Control:   g.control,
	}
	return g
}

// permitted reports whether the guard may connect to addr.
func (g *guard) permitted(addr netip.Addr) bool {
	addr = addr.WithZone("")
	for _, p := range g.allow {
		if p.Contains(addr) || p.Contains(addr.Unmap()) {
			return true
		}
	}
	return g.public && IsPublic(addr)
}

// control refuses a socket about to connect to an address the guard does
// not permit. DialContext only ever dials checked IPs, so this fires only
// if that logic is broken.
func (g *guard) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unparsable dial address %q", g.refusal, address)
	}
	if !g.permitted(ap.Addr()) {
		return fmt.Errorf("%w: %s", g.refusal, ap.Addr())
	}
	return nil
}

// DialContext resolves address's host, keeps the addresses the guard
// permits, and connects to the first of them that answers.
func (g *guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	if p, ok := g.ports[address]; ok {
		port = p
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		addrs, err = g.resolver.LookupNetIP(ctx, ipNetwork(network), host)
		if err != nil {
			return nil, err
		}
	}
	var ok []netip.Addr
	for _, a := range addrs {
		if g.permitted(a) {
			ok = append(ok, a)
		}
	}
	if len(ok) == 0 {
		g.log.DebugContext(ctx, "outbound: refused", "host", host, "addrs", addrs, "reason", g.refusal)
		return nil, fmt.Errorf("%w: %s resolves to %v", g.refusal, host, addrs)
	}
	if len(ok) > maxDialAddrs {
		ok = ok[:maxDialAddrs]
	}
	var errs []error
	for _, a := range ok {
		conn, err := g.dialer.DialContext(ctx, network, net.JoinHostPort(a.Unmap().String(), port))
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, errors.Join(errs...)
}

// ipNetwork maps a dial network to the address family to look up.
func ipNetwork(network string) string {
	switch network {
	case "tcp4", "udp4":
		return "ip4"
	case "tcp6", "udp6":
		return "ip6"
	}
	return "ip"
}
