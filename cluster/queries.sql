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
-- released them), or whose holder's process is gone: no session holds its
-- presence lock (holder_key, an advisory lock: pg_locks shows a bigint
-- key as its high and low 32 bits). A plain UPDATE locks only the rows it
-- takes, so trying costs a lease's holder nothing.
UPDATE cluster_leases l
SET holder = $1, holder_key = $4, epoch = l.epoch + 1, acquired_at = clock_timestamp(),
    expires_at = clock_timestamp() + make_interval(secs => $3)
WHERE l.name = ANY($2::text[])
  AND (l.expires_at < clock_timestamp()
       OR (l.holder_key <> 0 AND l.holder <> $1 AND NOT EXISTS (
           SELECT 1 FROM pg_locks k
           WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
             AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND k.classid = ((l.holder_key >> 32) & 4294967295)::oid
             AND k.objid = (l.holder_key & 4294967295)::oid)))
RETURNING l.name, l.epoch;

-- name: HoldPresence
-- Held by a holder's own session for as long as its process lives.
SELECT pg_advisory_lock($1);

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
INSERT INTO cluster_nodes (clock_id)
SELECT g FROM generate_series(0, 1023) g
WHERE (SELECT count(*) FROM cluster_nodes) < 1024
ON CONFLICT (clock_id) DO NOTHING;

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
SET node = $1, host = $3, version = $4, facts = $5, hint_addr = '', started_at = clock_timestamp(),
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

-- name: SetHintAddr
-- The UDP address a node reads commit hints on (hints.go).
UPDATE cluster_nodes SET hint_addr = $3 WHERE clock_id = $1 AND node = $2;

-- name: HintPeers
-- The hint addresses of the other nodes seen within $2 seconds.
SELECT hint_addr FROM cluster_nodes
WHERE hint_addr <> '' AND clock_id <> $1 AND stopped_at IS NULL
  AND seen_at > clock_timestamp() - make_interval(secs => $2);
