// Package cluster lets several Bulwark processes (nodes) share one
// Postgres database: leases for the jobs one node runs at a time, each
// node's TID clock id, and the facts every node must agree on.
//
// # Leases
//
// A singleton job (the firehose sequencer, retention pruning, blob
// collection, the relay watch) runs under a named lease, a row of
// cluster_leases with a holder, an epoch and an expiry kept by the
// database's clock. Leases renews the leases its node holds every tick and
// takes any that is free or whose holder let it expire, raising its epoch;
// a job's context ends when its lease is lost, which includes not having
// renewed it in time, so a node cut off from the database stops its jobs
// about when another node may take them over. A session advisory lock
// would not do: a frozen or partitioned process keeps its session, and its
// lock, until TCP gives up on it (hours by default), while every node
// waits. A holder that was frozen may still act for a moment after it
// wakes, before its deadline timer runs; what it publishes must therefore
// be fenced: the sequencer numbers events only in a transaction that finds
// the lease still at its epoch (bulwark_sequence, migrations/00019).
//
// With the defaults (DefaultLeaseTTL, a tick of a sixth of it) a holder
// that stops renewing is replaced within 3.5 s.
//
// # Nodes
//
// Join registers a node: it claims one of the 1,024 TID clock ids (the one
// seen longest ago, so a node that froze or was cut off for under a minute
// keeps its own), so that record keys and revs made by different nodes in
// the same microsecond differ; and it compares the node's facts (a
// fingerprint of each shared secret, the blob store) with those of the
// nodes running now, refusing to start a node that disagrees. The PLC
// rotation key's fingerprint is also kept for good: it seals every
// account's signing key, and a node started with another key could read
// none of them.
package cluster
