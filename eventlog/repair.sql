-- name: InspectEvents
-- Sizes come from octet_length, which reads only the TOAST pointer: listing
-- events never loads their blocks.
SELECT seq, did, kind, coalesce(rev, ''), created_at, octet_length(body), blocks_len, ops_count, invalidated
FROM events
WHERE seq IS NOT NULL
  AND seq >= $1 AND ($2::bigint = 0 OR seq <= $2)
  AND ($3 = '' OR did = $3)
  AND ($4 = '' OR kind = $4)
ORDER BY seq
LIMIT $5;

-- name: InspectEventsDesc
-- InspectEvents newest first.
SELECT seq, did, kind, coalesce(rev, ''), created_at, octet_length(body), blocks_len, ops_count, invalidated
FROM events
WHERE seq IS NOT NULL
  AND seq >= $1 AND ($2::bigint = 0 OR seq <= $2)
  AND ($3 = '' OR did = $3)
  AND ($4 = '' OR kind = $4)
ORDER BY seq DESC
LIMIT $5;

-- name: EventBody
SELECT kind, body FROM events WHERE seq = $1;

-- name: LockEvent
SELECT did, kind, coalesce(rev, ''), body, seq_offset, blocks_len, ops_count, invalidated
FROM events WHERE seq = $1 FOR UPDATE;

-- name: RewriteEvent
UPDATE events
SET kind = $2, body = $3, seq_offset = $4, blocks_len = $5, ops_count = $6
WHERE seq = $1;

-- name: InvalidateEvent
UPDATE events SET invalidated = true WHERE seq = $1;
