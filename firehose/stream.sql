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
