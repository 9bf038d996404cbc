package limits

// Protocol limits, in bytes or counts, as the atproto specs and lexicons
// give them and indigo's relay enforces them.
const (
	// MaxRecordCBORBytes is the data-model limit on one record encoded as
	// DAG-CBOR (MAX_CBOR_RECORD_SIZE in the data-validation guide).
	MaxRecordCBORBytes = 1_048_576

	// MaxRecordBlockBytes is the sync spec's hard limit on one record block
	// inside a #commit. It is lower than MaxRecordCBORBytes, so it is the
	// effective ceiling on a record written through a commit.
	MaxRecordBlockBytes = 1_000_000

	// MaxCommitBlocksBytes bounds the CAR of all blocks of one #commit
	// (header, commit, MST nodes, records): the lexicon's maxLength for
	// blocks and the relay's MaxMessageBlocksBytes.
	MaxCommitBlocksBytes = 2_000_000

	// MaxCommitOps is the most operations one commit (and one applyWrites
	// request) may carry: the lexicon's maxLength for ops and the relay's
	// MaxCommitOps.
	MaxCommitOps = 200

	// MaxFrameBytes is the largest event-stream frame relays accept: above
	// it indigo's relay drops the whole connection (MaxMessageBytes).
	MaxFrameBytes = 5_000_000

	// MaxSyncBlocksBytes is the lexicon's maxLength for the blocks of a
	// #sync event (the signed commit alone).
	MaxSyncBlocksBytes = 10_000
)
