-- Blob references of an imported repository (import.go). The import
-- replaces every record of the account, so it replaces every reference.

-- name: ImportDropRefs
DELETE FROM record_blobs WHERE did = $1;

-- name: ImportAddRefs
-- References may name blobs the account has not uploaded: listMissingBlobs
-- lists those until an upload makes them present (InsertBlob then makes
-- them permanent at once).
INSERT INTO record_blobs (did, record_path, blob_cid, rev)
SELECT $1, n.path, n.cid, $4 FROM unnest($2::text[], $3::text[]) AS n(path, cid)
ON CONFLICT (did, record_path, blob_cid) DO NOTHING;

-- name: ImportKeepReferenced
-- Uploaded blobs the imported records refer to become permanent.
UPDATE blobs b SET temp_since = NULL
WHERE b.did = $1 AND b.temp_since IS NOT NULL
  AND EXISTS (SELECT 1 FROM record_blobs r WHERE r.did = b.did AND r.blob_cid = b.cid);

-- name: ImportReleaseUnreferenced
-- Blobs only the replaced records referred to start their expiry.
UPDATE blobs b SET temp_since = now()
WHERE b.did = $1 AND b.temp_since IS NULL
  AND NOT EXISTS (SELECT 1 FROM record_blobs r WHERE r.did = b.did AND r.blob_cid = b.cid);
