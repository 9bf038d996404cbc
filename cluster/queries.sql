-- name: EnsureLeases
-- A lease row exists before anyone can take it (UPDATE-only takeovers
-- never lock a row they do not take).
INSERT INTO cluster_leases (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING;

-- name: RenewLeases
-- Extends the leases $1 holds at the given epochs; a lease another node
-- took over in the meantime is not returned.
UPDATE cluster_leases l
SET expires_at = clock_timestamp() + make_interval(secs => $4)
FROM unnest($2::text[], $3::bigint[]) AS h(name, epoch)
WHERE l.name = h.name AND l.epoch = h.epoch AND l.holder = $1
RETURNING l.name, l.epoch;

-- name: TakeLeases
-- Takes the leases among $2 whose holder has not renewed in time (or
-- released them). A plain UPDATE locks only the rows it takes, so trying
-- costs a lease's holder nothing.
UPDATE cluster_leases
SET holder = $1, epoch = epoch + 1, acquired_at = clock_timestamp(),
    expires_at = clock_timestamp() + make_interval(secs => $3)
WHERE name = ANY($2::text[]) AND expires_at < clock_timestamp()
RETURNING name, epoch;

-- name: ReleaseLeases
-- Ends leases at once, for a holder that stops: another node takes them at
-- its next tick instead of waiting out the expiry.
UPDATE cluster_leases l
SET expires_at = '-infinity'
FROM unnest($2::text[], $3::bigint[]) AS h(name, epoch)
WHERE l.name = h.name AND l.epoch = h.epoch AND l.holder = $1;

-- name: FenceLease
-- The share lock makes a takeover (an UPDATE of the row) wait for the
-- fenced transaction.
SELECT epoch FROM cluster_leases WHERE name = $1 FOR SHARE;

-- name: LeaseHolders
SELECT name, holder, epoch, expires_at > clock_timestamp() FROM cluster_leases ORDER BY name;

-- name: LockNodes
-- Serialises nodes joining, so two starting at once each see the other.
SELECT pg_advisory_xact_lock(hashtextextended('bulwark.cluster.join', 0));

-- name: SeedNodes
-- One row per clock id (a restored backup has none: which nodes ran is
-- not part of it).
INSERT INTO cluster_nodes (clock_id) SELECT generate_series(0, 1023) ON CONFLICT (clock_id) DO NOTHING;

-- name: LiveNodes
-- Nodes seen within $1 seconds that have not stopped.
SELECT clock_id, node, host, version, started_at, facts
FROM cluster_nodes
WHERE stopped_at IS NULL AND seen_at > clock_timestamp() - make_interval(secs => $1)
ORDER BY clock_id;

-- name: ClaimClockID
-- The clock id seen longest ago among those stopped or not seen for $2
-- seconds: a node that froze or lost its connection for less than that
-- keeps its id.
UPDATE cluster_nodes n
SET node = $1, host = $3, version = $4, facts = $5, started_at = clock_timestamp(),
    seen_at = clock_timestamp(), stopped_at = NULL
WHERE n.clock_id = (
    SELECT clock_id FROM cluster_nodes
    WHERE stopped_at IS NOT NULL OR seen_at < clock_timestamp() - make_interval(secs => $2)
    ORDER BY seen_at, clock_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING n.clock_id;

-- name: NodeSeen
UPDATE cluster_nodes SET seen_at = clock_timestamp() WHERE clock_id = $1 AND node = $2;

-- name: NodeStopped
UPDATE cluster_nodes SET stopped_at = clock_timestamp() WHERE clock_id = $1 AND node = $2;

-- name: GetFact
SELECT value, set_by, updated_at FROM cluster_facts WHERE name = $1;

-- name: SetFact
INSERT INTO cluster_facts (name, value, set_by) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, set_by = excluded.set_by, updated_at = now();
