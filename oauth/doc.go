// Package oauth is Bulwark's OAuth authorization server and the resource
// server's token check, following the atproto OAuth profile: pushed
// authorization requests only, PKCE S256 only, DPoP-bound tokens with
// server nonces, client metadata fetched from the client_id URL (and the
// http://localhost development form), public and private_key_jwt clients,
// refresh-token rotation with reuse detection, and the atproto permission
// scopes.
//
// The integrator mounts Routes on its mux, implements Accounts over its
// account store, passes the SSRF-guarded outbound client as HTTPClient,
// and calls Authenticate for requests with "Authorization: DPoP ...",
// then the AccessInfo's Can* checks per XRPC method.
//
// Browser pages (sign-in, account choice, consent, connected apps) are
// server-rendered with html/template: no scripts, one stylesheet served
// from this package, a strict Content-Security-Policy, and a CSRF token
// derived from the device cookie on every form.
//
// State lives in Postgres (migrations/00013_oauth.sql); the client
// metadata cache and the DPoP replay memory are per process.
package oauth
