// Package outbound is the one way Bulwark fetches URLs that users
// influence: handle resolution, did:web documents, service proxying, OAuth
// client metadata, relay watch. A Client dials only public unicast
// addresses (and networks the operator allows), over https only (plain
// http only to allowed networks), follows redirects only when a call
// allows it and then checks every hop again, never uses HTTP_PROXY, and
// bounds every request's time and response size.
//
// The check happens when connecting, after DNS resolution: the client
// resolves the name itself, drops every address it may not reach, and
// connects to a checked IP, so a name that resolves differently the second
// time (DNS rebinding) gains nothing. Refused (see IsPublic and guard.go
// for the sources of each range):
//
//	IPv4  0.0.0.0/8 this network       10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 private
//	      100.64.0.0/10 CGNAT          127.0.0.0/8 loopback
//	      169.254.0.0/16 link-local    192.0.0.0/24 IETF protocol assignments
//	      192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 documentation
//	      192.88.99.0/24 6to4 relay    198.18.0.0/15 benchmarking
//	      224.0.0.0/4 multicast        240.0.0.0/4 reserved, 255.255.255.255 broadcast
//	IPv6  everything outside 2000::/3 (::, ::1, ::/96 IPv4-compatible, 100::/64
//	      discard, 64:ff9b:1::/48 local NAT64, fc00::/7 unique-local,
//	      fe80::/10 link-local, fec0::/10 site-local, ff00::/8 multicast),
//	      and inside it 2001::/23 (Teredo, benchmarking, ORCHID),
//	      2001:db8::/32 and 3fff::/20 documentation, 2002::/16 6to4
//	      ::ffff:a.b.c.d (IPv4-mapped) and 64:ff9b::a.b.c.d (NAT64) are
//	      judged by the IPv4 address they carry
//
// Errors wrap ErrForbiddenAddress, ErrForbiddenScheme, ErrRedirect or
// ErrResponseTooLarge, and errors.Is finds them through net/http's
// *url.Error. Refused tells a refusal from a remote failure; a server
// answering untrusted clients should report a refusal as it reports "not
// found", which ResolveHandle and Directory do for it (their not-found
// errors also wrap the refusal).
//
// On top of the client: Client.ResolveHandle (DNS TXT, then the HTTPS
// well-known through the guard) and Directory, an indigo
// identity.Directory that resolves did:plc at the operator's PLC
// directory (not guarded: it is configuration) and did:web through the
// guard, with a bounded TTL cache.
package outbound
