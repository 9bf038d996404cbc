-- name: BlobCounts
-- Distinct blobs the account's records refer to, and how many of those are
-- stored (com.atproto.server.checkAccountStatus: expectedBlobs,
-- importedBlobs).
SELECT count(DISTINCT r.blob_cid),
       count(DISTINCT b.cid)
FROM record_blobs r
LEFT JOIN blobs b ON b.did = r.did AND b.cid = r.blob_cid
WHERE r.did = $1;
