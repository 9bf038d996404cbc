-- name: InsertEvent
INSERT INTO events (did, kind, rev, body, seq_offset, blocks_len, ops_count)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: LockSequencer
SELECT last_seq FROM sequencer_state WHERE id = 1 FOR UPDATE;

-- name: SequenceBatch
-- One round trip: see bulwark_sequence in migrations/00007.
SELECT numbered, last_seq FROM bulwark_sequence($1);

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

-- name: TryLeadership
SELECT pg_try_advisory_lock($1);
