-- name: LockCID
-- Serialises, across nodes, the upload of some bytes with the deletion of
-- their object: see Service.Upload and Service.collect.
SELECT pg_advisory_xact_lock(hashtextextended('bulwark.blob:' || $1, 0));

-- name: InsertBlob
-- A blob some record already refers to (an imported repository's) is
-- permanent at once; a re-upload of an unreferenced blob restarts its
-- expiry.
INSERT INTO blobs AS b (did, cid, mime, size, storage_key, temp_since)
VALUES ($1, $2, $3, $4, $5,
        CASE WHEN EXISTS (SELECT 1 FROM record_blobs r WHERE r.did = $1 AND r.blob_cid = $2)
             THEN NULL ELSE now() END)
ON CONFLICT (did, cid) DO UPDATE
SET temp_since = CASE WHEN b.temp_since IS NULL THEN NULL ELSE now() END;

-- name: GetBlob
SELECT mime, size, storage_key FROM blobs
WHERE did = $1 AND cid = $2 AND temp_since IS NULL;

-- name: DeleteStaleRefs
-- References of the touched records that the records no longer make.
DELETE FROM record_blobs rb
WHERE rb.did = $1 AND rb.record_path = ANY($2::text[])
  AND NOT EXISTS (
      SELECT 1 FROM unnest($3::text[], $4::text[]) AS n(path, cid)
      WHERE n.path = rb.record_path AND n.cid = rb.blob_cid)
RETURNING rb.blob_cid;

-- name: UpsertRefs
INSERT INTO record_blobs (did, record_path, blob_cid, rev)
SELECT $1, n.path, n.cid, $4 FROM unnest($2::text[], $3::text[]) AS n(path, cid)
ON CONFLICT (did, record_path, blob_cid) DO UPDATE SET rev = excluded.rev;

-- name: MakePermanent
-- Row locks taken here make a concurrent collector wait and then see the
-- blob as permanent (or make this find it gone). Each row comes back with
-- its stored type and size, and whether this made it permanent (a first
-- reference, which is checked against what the record says).
WITH target AS (
    SELECT cid, mime, size, temp_since IS NOT NULL AS was_temp
    FROM blobs WHERE did = $1 AND cid = ANY($2::text[])
    FOR UPDATE
), made AS (
    UPDATE blobs b SET temp_since = NULL
    FROM target t
    WHERE b.did = $1 AND b.cid = t.cid AND t.was_temp
)
SELECT cid, mime, size, was_temp FROM target;

-- name: ReleaseUnreferenced
UPDATE blobs b SET temp_since = now()
WHERE b.did = $1 AND b.cid = ANY($2::text[]) AND b.temp_since IS NULL
  AND NOT EXISTS (SELECT 1 FROM record_blobs r WHERE r.did = b.did AND r.blob_cid = b.cid);

-- name: ExpiredBlobs
SELECT did, cid FROM blobs
WHERE temp_since IS NOT NULL AND temp_since < $1
ORDER BY temp_since
LIMIT $2;

-- name: DeleteExpiredBlob
DELETE FROM blobs b
WHERE b.did = $1 AND b.cid = $2 AND b.temp_since IS NOT NULL AND b.temp_since < $3
  AND NOT EXISTS (SELECT 1 FROM record_blobs r WHERE r.did = b.did AND r.blob_cid = b.cid)
RETURNING storage_key;

-- name: ObjectInUse
SELECT EXISTS (SELECT 1 FROM blobs WHERE cid = $1);

-- name: ListBlobs
-- Blobs referenced by the account's records, optionally only by records
-- written after rev $2, in CID order after cursor $3.
SELECT DISTINCT blob_cid FROM record_blobs
WHERE did = $1 AND ($2 = '' OR rev > $2) AND blob_cid > $3
ORDER BY blob_cid
LIMIT $4;

-- name: ListMissingBlobs
SELECT DISTINCT ON (r.blob_cid) r.blob_cid, r.record_path FROM record_blobs r
WHERE r.did = $1 AND r.blob_cid > $2
  AND NOT EXISTS (SELECT 1 FROM blobs b WHERE b.did = r.did AND b.cid = r.blob_cid)
ORDER BY r.blob_cid, r.record_path
LIMIT $3;

-- name: DeleteAccountRefs
DELETE FROM record_blobs WHERE did = $1;

-- name: ExpireAccountBlobs
-- A deleted account's blobs become unreferenced long ago: the next
-- collection removes them (and their objects, unless another account holds
-- the same bytes).
UPDATE blobs SET temp_since = '-infinity' WHERE did = $1;
