// Package firehose serves com.atproto.sync.subscribeRepos: it streams the
// event log (package eventlog) to relays and other consumers, and protects
// the server from them.
//
// The Hub reads each newly sequenced event once, encodes its frame once and
// hands the same bytes to every live subscription (hub.go, livequeue.go); a
// subscription with a cursor backfills from the log a page at a time, at
// the pace its socket takes the frames, then joins the live fan-out without
// losing or repeating an event (subscription.go). Frames are written as
// they are stored, except events over a protocol limit, which go out as
// #sync (frames.go, eventlog.SyncFrame).
//
// Protection: Admission decides before the WebSocket upgrade, at the cost
// of a map lookup, whether a client may subscribe (a per-client token
// bucket, connection caps); backfill pages draw from the shared in-flight
// byte budget and yield to writes in flight; Health notices a consumer that
// keeps reconnecting at the same cursor, names the event it is stuck on,
// holds its next connections (upgraded, no database work) until that event
// is repaired, and reports runs of failed connections and cursors beyond
// our head once each (health.go, stuck.go, incident.go). CrawlNotifier
// asks relays to crawl the server after writes.
//
// Nothing below the HTTP layer depends on this package: the commit engine
// and the account service append to the event log through eventlog alone.
package firehose
