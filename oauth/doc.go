// Package oauth is Bulwark's OAuth authorization server and the resource
// server's token check, following the atproto OAuth profile: pushed
// authorization requests only, PKCE S256 only, DPoP-bound tokens with
// server nonces, client metadata fetched from the client_id URL (and the
// http://localhost development form), public and private_key_jwt clients,
// refresh-token rotation with reuse detection, the atproto permission
// scopes, permission sets (include: scopes, permset.go and permcache.go:
// resolved through Config.Lexicons, verified, expanded within the set's
// namespace, cached with bounds) and silent re-authorization for apps
// that hold a grant (prompt=none, silent.go).
//
// The integrator mounts Routes on its mux, implements Accounts over its
// account store, passes the SSRF-guarded outbound client as HTTPClient,
// and calls Authenticate for requests with "Authorization: DPoP ...",
// then the AccessInfo's Can* checks per XRPC method.
//
// Browser pages (sign-in, account choice, consent, connected apps) are
// server-rendered with html/template: no scripts, one stylesheet served
// from this package, a strict Content-Security-Policy, and a CSRF token
// derived from the browser's cookie on every form. Nothing is stored for
// a browser until someone signs in on it (device.go), and it then gets a
// fresh cookie.
//
// Nothing a visitor or an app sends grows the state without bound
// (limits.go): every route is under a per-address rate limit
// (Config.Limits), PAR and token also per client_id; pending requests are
// capped per client and overall, single-use values and spent refresh
// tokens trimmed, and the client metadata cache (clientcache.go) bounded
// in entries, bytes and concurrent fetches.
//
// State lives in Postgres (migrations/00013_oauth.sql,
// 00016_oauth_bounds.sql, 00030_oauth_permission_sets.sql); the client
// metadata and permission set caches, the DPoP replay memory and the rate
// limits are per process. Access tokens carry no scope: each use reads
// its grant, whose permissions (the scope with its sets expanded) it
// checks against.
package oauth
