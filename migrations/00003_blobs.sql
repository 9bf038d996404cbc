-- +goose Up

-- Blobs an account has uploaded. The same bytes uploaded by two accounts are
-- two rows sharing one stored object (storage_key): objects are content
-- addressed, and an object is deleted only when no row names it.
--
-- temp_since is NULL for a permanent blob (some record of the account refers
-- to it) and otherwise the time the blob became unreferenced: when it was
-- uploaded, or when its last referencing record went. The garbage collector
-- deletes blobs whose temp_since is older than the configured expiry.
CREATE TABLE blobs (
    did         text        NOT NULL,
    cid         text        NOT NULL, -- raw-codec CID, bafkrei...
    mime        text        NOT NULL, -- sniffed from the bytes, not taken from the client
    size        bigint      NOT NULL,
    storage_key text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    temp_since  timestamptz,
    PRIMARY KEY (did, cid)
);
CREATE INDEX blobs_expiry ON blobs (temp_since) WHERE temp_since IS NOT NULL;
CREATE INDEX blobs_cid ON blobs (cid);

-- Which record refers to which blob. Rows may name a blob the account has
-- not uploaded (an imported repository): listMissingBlobs reports those.
CREATE TABLE record_blobs (
    did         text NOT NULL,
    record_path text NOT NULL, -- collection/rkey
    blob_cid    text NOT NULL,
    rev         text NOT NULL, -- rev of the commit that last wrote the record (listBlobs ?since)
    PRIMARY KEY (did, record_path, blob_cid)
);
CREATE INDEX record_blobs_blob ON record_blobs (did, blob_cid);

-- +goose Down
DROP TABLE record_blobs;
DROP TABLE blobs;
