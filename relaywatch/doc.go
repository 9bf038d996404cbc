// Package relaywatch asks each relay, every minute, how far it has read
// this server's firehose (com.atproto.sync.getHostStatus) and tells the
// operator when one falls behind, stops at an event it cannot get past, is
// throttled or banned, or has forgotten this server — before users notice
// that their posts never appear.
//
// A relay's answer carries the last seq it persisted for us and its status
// for us (active, idle, offline, throttled, banned); an XRPC HostNotFound
// error means it does not know us, and the watch asks it to crawl again.
// Compared with our own head seq, the answers give each relay one State.
// A relay is stuck when it reports the same seq on StuckChecks checks in a
// row while the first event after it has existed for StuckFor: relays
// report the position they last saved, every few seconds, so a seq that
// stands still between two close checks says nothing.
// Entering a bad state logs one warning naming the relay, its seq, the
// event after it (kind, size, the limit it breaks) and the `bulwark admin
// firehose` command that would repair it; recovery logs one info line.
// Every relay's state is also a Prometheus gauge, and Snapshot serves the
// operator console.
//
// The watch does no database work of its own: the caller supplies the head
// seq (HeadReader) and, only when a relay enters behind or stuck, a
// description of the events after the relay's seq (EventReader).
package relaywatch
