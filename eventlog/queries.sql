-- name: InsertEvent
INSERT INTO events (did, kind, rev, body, seq_offset, blocks_len, ops_count)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: LockSequencer
SELECT last_seq FROM sequencer_state WHERE id = 1 FOR UPDATE;

-- name: SequenceBatch
-- One round trip: see bulwark_sequence in migrations/00019 (fenced by the
-- lease $2 at epoch $3; unfenced when they are NULL).
SELECT numbered, last_seq FROM bulwark_sequence($1::integer, $2::text, $3::bigint);

-- name: RaiseLastSeq
UPDATE sequencer_state SET last_seq = greatest(last_seq, $1) WHERE id = 1 RETURNING last_seq;

-- name: LastSeq
SELECT last_seq FROM sequencer_state WHERE id = 1;

-- name: EventsAfter
SELECT seq, did, kind, coalesce(rev, ''), created_at, body, seq_offset, blocks_len, ops_count
FROM events
WHERE seq > $1 AND seq IS NOT NULL AND NOT invalidated
ORDER BY seq
LIMIT $2;

-- name: CursorPoint
-- Reads only seq and created_at (index-only scan on events_seq_created).
SELECT seq, created_at FROM events
WHERE seq >= $1 AND seq IS NOT NULL
ORDER BY seq
LIMIT 1;

-- name: FirstSeqSince
-- Walks seq order on events_seq_created (index-only); retention keeps the
-- events before $1 few.
SELECT seq FROM events
WHERE seq IS NOT NULL AND created_at >= $1
ORDER BY seq
LIMIT 1;

-- name: EventsAfterBounded
-- Like EventsAfter, but stops after the event that brings the bodies read
-- to $3 bytes (always at least one event). octet_length of a TOASTed bytea
-- reads only its header, so the rows left out are never fetched.
SELECT seq, did, kind, rev, created_at, body, seq_offset, blocks_len, ops_count
FROM (
    SELECT seq, did, kind, coalesce(rev, '') AS rev, created_at, body, seq_offset, blocks_len, ops_count,
           sum(octet_length(body)) OVER (ORDER BY seq) - octet_length(body) AS before
    FROM events
    WHERE seq > $1 AND seq IS NOT NULL AND NOT invalidated
    ORDER BY seq
    LIMIT $2
) p
WHERE before < $3
ORDER BY seq;

-- name: PruneEvents
-- Deletes, of the $2 oldest sequenced events, those created before $1. It
-- walks seq order (index-only on events_seq_created), which follows
-- created_at, so pruning stops at the first batch that is not all old.
DELETE FROM events
WHERE seq IN (
    SELECT seq FROM (
        SELECT seq, created_at FROM events WHERE seq IS NOT NULL ORDER BY seq LIMIT $2
    ) oldest
    WHERE created_at < $1
);

-- name: ListenSequenced
LISTEN bulwark_sequenced;

-- name: OldestSeq
-- Index-only on events_seq_created.
SELECT seq FROM events WHERE seq IS NOT NULL ORDER BY seq LIMIT 1;

-- name: CountUnsequenced
-- Committed events still waiting for a seq, counted up to $1 (the partial
-- index events_unsequenced), for the sequencer's backlog metric.
SELECT count(*) FROM (SELECT 1 FROM events WHERE seq IS NULL LIMIT $1) p;
