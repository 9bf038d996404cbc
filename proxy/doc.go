// Package proxy forwards the XRPC methods Bulwark does not serve itself to
// the service that does, as the reference PDS does: the app view for
// app.bsky.*, chat and notification services named by the atproto-proxy
// header, the moderation service for tools.ozone.*, the report service for
// com.atproto.moderation.createReport.
//
// A request goes through four steps, each usable on its own:
//
//  1. policy ([Check]): protected account-management methods are never
//     proxied and privileged ones (chat, createAccount) need a privileged
//     session;
//  2. routing ([Proxy.Target]): the atproto-proxy header names a DID and a
//     service id, resolved through a [Resolver]; without it the method's
//     namespace picks a configured service;
//  3. service auth: an authenticated caller's request carries a fresh
//     service-auth JWT signed with the account's key (aud = the target's
//     DID, lxm = the method; for app.bsky.feed.getFeed, aud = the feed
//     generator and lxm = getFeedSkeleton);
//  4. forwarding ([Proxy.Forward]): an allow-list of headers each way,
//     bodies streamed with bounded memory; the answer bounded in size, in
//     each wait, in total time and in average rate; upstream failures
//     mapped to typed errors ([*Error]), a service's own error statuses
//     passed on as the reference PDS passes them; and read-after-write for
//     the caller's own recent posts and profile when the app view lags
//     behind the repository, or names its current commit while it may
//     still be indexing it (indexingGrace) (its answers spliced, its
//     NotFound for the caller's new post answered with the post's thread).
//
// How many proxied requests may be in flight, per client and in all, is
// the XRPC layer's to decide once [Proxy.RequestTarget] has said where a
// request goes ([Target.Configured]).
//
// [Proxy.Serve] runs all four. The package knows nothing of sessions or
// storage: the XRPC layer says who the caller is ([Caller]) and supplies
// signing keys ([KeySource]) and the caller's recent records ([LocalState]).
package proxy
