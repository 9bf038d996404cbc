// Package fakeservices runs stand-ins for the services a PDS proxies to:
// an app view, a chat service and a feed generator. Tests and the
// @atproto/api end-to-end script (scripts/proxy-api.sh, through
// internal/cmd/fakeservices) point Bulwark at them.
//
// Each service has a did:plc of its own, registered in a PLC directory with
// its service entry (#bsky_appview and #bsky_notif, #bsky_chat, #bsky_fg)
// and #atproto key. Every request is recorded (service, method, and the
// iss, aud and lxm of its service-auth token); every token is checked with
// indigo's auth.ServiceAuthValidator against the directory, the audience
// being the service's DID and the lexicon method the one called, as a real
// service checks it. The app view's getFeed checks for the feed
// generator's audience and lxm app.bsky.feed.getFeedSkeleton, and passes
// the token on to the generator, as Bluesky's app view does. GET
// /_recorded on any of them answers what they all recorded, as JSON;
// POST /_repoRev?did=...&rev=... sets the revision the app view claims
// to have seen of an account (Services.SetRepoRev).
//
// The answers are small fixed documents in the lexicons' shapes: enough
// for a client library to parse, not a social network.
package fakeservices
