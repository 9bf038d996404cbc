// Package firehose owns Bulwark's event stream: the event log in Postgres,
// the sequencer that gives committed events their public seq, frame encoding,
// and (in later files) com.atproto.sync.subscribeRepos serving.
//
// Events are appended inside the writer's transaction with no seq. The
// Sequencer assigns seqs to committed events in batches, one Postgres
// transaction per batch, serialised by the sequencer_state row lock; a reader
// asking for "seq > cursor" therefore sees a prefix of the stream and can
// never pass over an event that commits later (the bigserial trap described
// in ARCHITECTURE.md), while writers to different repos never wait for each
// other.
package firehose
