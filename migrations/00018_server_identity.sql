-- +goose Up

-- The host name this database's accounts are served under: their DID
-- documents name https://<hostname> (or http:// for a local one) as their
-- PDS. A server started under another name against these accounts is
-- refused at start, and a backup records this name.
CREATE TABLE server_identity (
    id          integer     PRIMARY KEY CHECK (id = 1),
    hostname    text        NOT NULL,
    public_url  text        NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE server_identity;
