-- Queries of the development PLC directory's Postgres store
-- (table dev_plc_operations, migration 00012).

-- name: Log
SELECT operation, cid, created_at
FROM dev_plc_operations
WHERE did = $1
ORDER BY seq;

-- Inserts nothing unless the DID's log holds exactly $2 entries; the
-- primary key settles two writers that both saw $2.
-- name: Append
INSERT INTO dev_plc_operations (did, seq, cid, operation, created_at)
SELECT $1, $2::integer, $3, $4::jsonb, $5
WHERE (SELECT count(*) FROM dev_plc_operations WHERE did = $1) = $2::integer;

-- name: Count
SELECT count(*) FROM dev_plc_operations WHERE seq = 0;
