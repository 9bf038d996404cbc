package main

import (
	"log/slog"
	"net/netip"
	"slices"

	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/oauth"
	"github.com/bulwark-pds/bulwark/outbound"
)

// privateNetworks are the networks an OAuth client's metadata may be
// fetched from with --oauth-allow-private-clients (development: an app on
// this machine or the local network).
var privateNetworks = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("fc00::/7"),
}

// newOAuthConfig is the OAuth authorization server's configuration: this
// server's public URL as the issuer, the session-token secret (the oauth
// package derives its own keys from it), and the shared SSRF-guarded
// client for client metadata documents (with
// --oauth-allow-private-clients, one that also reaches this machine and
// private networks). pds.New fills in the database and accounts, and
// resolves permission sets (lexicon resolution) through the shared
// client.
func newOAuthConfig(cfg *config.Config, shared *outbound.Client, logger *slog.Logger) *oauth.Config {
	client := shared
	if cfg.OAuthAllowPrivateClients {
		logger.Warn("OAuth apps may publish their metadata on private addresses (--oauth-allow-private-clients): for development only")
		client = outbound.New(outbound.Config{AllowCIDRs: append(slices.Clone(privateNetworks), cfg.ProxyAllowPrivate...),
			Resolver: dnsResolver(cfg), Logger: logger})
	}
	return &oauth.Config{
		Issuer:                cfg.PublicURL(),
		Secret:                []byte(cfg.JWTSecret),
		HTTPClient:            client.HTTPClient(),
		AllowPrivateClientIDs: cfg.OAuthAllowPrivateClients,
		Logger:                logger,
	}
}

// dnsResolver is the resolver of the server's outbound lookups: the
// --dns-server, or nil for the system's.
func dnsResolver(cfg *config.Config) outbound.Resolver {
	if cfg.DNSServer == "" {
		return nil
	}
	return outbound.DNSResolver(cfg.DNSServer)
}
