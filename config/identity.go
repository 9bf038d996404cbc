package config

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/bulwark-pds/bulwark/plc"
)

// hostnameFor is the host name of a server listening on listen with none
// configured: localhost with the listen port, so that PublicURL is a URL
// that reaches it. Port 0 (chosen by the kernel) gives plain localhost
// until Bound learns the real port.
func hostnameFor(listen string) string {
	_, port, err := net.SplitHostPort(listen)
	if err != nil || port == "" || port == "0" {
		return DefaultHost
	}
	return net.JoinHostPort(DefaultHost, port)
}

// handleDomainFor is the handle suffix a server on host offers by
// default: ".<host>", unless handles there would be refused across the
// network (indigo, the reference PDS and its clients refuse .localhost,
// .local, .internal, ... and IP addresses are no handles at all); then
// ".test", the suffix reserved for development that they all accept.
func handleDomainFor(host string) string {
	h, err := syntax.ParseHandle("a." + host)
	if err != nil || !h.AllowedTLD() {
		return ".test"
	}
	return "." + host
}

// HostnameDerived reports that no host name was configured and Finalize
// made one up from the listen port (localhost:<port>): fine on one
// machine, never what a server others reach should publish.
func (c *Config) HostnameDerived() bool { return c.hostnameDerived }

// deriveIdentity fills the defaults that depend on whether the host name
// is local: the PLC directory (this server's development one, or
// plc.directory) and whether sign-up needs an invite.
func (c *Config) deriveIdentity() {
	local := c.IsLocalHost()
	c.DevPLC = local && (c.PLCURL == "" || sameURL(c.PLCURL, c.PublicURL()))
	switch {
	case c.DevPLC:
		c.PLCURL = c.PublicURL()
	case c.PLCURL == "":
		c.PLCURL = DefaultPLCURL
	}
	// Only ever raised: a programmatic InviteRequired = true on a local
	// host name stays.
	if !c.inviteSet && !local {
		c.InviteRequired = true
	}
}

// sameURL compares two base URLs, ignoring case and a trailing slash.
func sameURL(a, b string) bool {
	norm := func(s string) string { return strings.TrimRight(strings.ToLower(strings.TrimSpace(s)), "/") }
	return norm(a) == norm(b)
}

// Bound records the address the server really listens on, once its
// listener is open. A host name Finalize derived from a listen address
// with port 0 then gets the real port, and the development PLC's URL
// follows it. Call it after Finalize.
func (c *Config) Bound(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return settingError("listen", "bound address %q: %v", addr, err)
	}
	c.Listen = addr
	if !c.hostnameDerived {
		return nil
	}
	old := c.PublicURL()
	c.Hostname = hostnameFor(addr)
	if c.DevPLC && c.PLCURL == old {
		c.PLCURL = c.PublicURL()
	}
	return c.Validate()
}

// validatePLCEndpoint refuses to publish this server's plain-http URL in
// a public PLC directory (plc.CheckEndpoint), naming both settings and
// the way out that fits the host name.
func (c *Config) validatePLCEndpoint() error {
	err := plc.CheckEndpoint(c.PLCURL, c.PublicURL())
	if err == nil {
		return nil
	}
	if !errors.Is(err, plc.ErrInsecureEndpoint) {
		return settingError("plc-url", "%v", err)
	}
	why := fmt.Sprintf("%s is a public PLC directory, and this server's URL %s (from --hostname, BULWARK_HOSTNAME=%s) is plain http: "+
		"every DID made here would be published there pointing at an address no one else can reach, and cannot be taken back",
		c.PLCURL, c.PublicURL(), c.Hostname)
	fix := "set BULWARK_HOSTNAME to the server's public name without a port (served over https by a TLS proxy), " +
		"or set BULWARK_PLC_URL to a directory on this machine or network"
	if c.IsLocalHost() {
		fix = "unset BULWARK_PLC_URL (a local host name gets a development PLC directory in this server), " +
			"or set BULWARK_HOSTNAME to the server's public name served over https"
	}
	return fmt.Errorf("invalid --plc-url (BULWARK_PLC_URL) with --hostname (BULWARK_HOSTNAME): %s; %s", why, fix)
}
