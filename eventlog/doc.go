// Package eventlog owns Bulwark's event log: the events table every
// repository change and account change is published through.
//
// It encodes events (#commit, #sync, #identity, #account) with a placeholder
// where the seq goes, appends them inside the writer's own transaction, and
// numbers them afterwards: events are appended with no seq, and the
// Sequencer assigns seqs to committed events in batches, one Postgres
// transaction per batch, serialised by the sequencer_state row lock. A
// reader asking for "seq > cursor" therefore sees a prefix of the stream
// and can never pass over an event that commits later (which a bigserial
// would allow: transactions commit out of order), while writers to
// different repositories never wait for each other.
//
// It also keeps the log within bounds and sound: the Pruner deletes events
// past the retention window, Oversized and SyncFrame decide which stored
// events break a protocol limit and what goes out instead (a #sync), and
// the repair operations (Inspect, RewriteAsSync, Invalidate,
// RepairOversized, EmitSync, RaiseSeqAudited) let an operator fix the log
// without SQL, each in one audited transaction.
//
// Serving the log to subscribers (WebSockets, admission, consumer health)
// is package firehose's; this package depends on nothing that streams, so
// the commit engine can append events without it.
package eventlog
