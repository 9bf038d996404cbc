-- name: BlobKnown
-- Whether did uploaded the blob or one of its records refers to it.
SELECT EXISTS (SELECT 1 FROM blobs WHERE did = $1 AND cid = $2)
    OR EXISTS (SELECT 1 FROM record_blobs WHERE did = $1 AND blob_cid = $2);
