-- +goose Up

-- One row per hosted repository: the current signed commit. Writers lock this
-- row (SELECT ... FOR UPDATE) for the length of a commit transaction, so the
-- root read inside the lock is the root the commit builds on.
CREATE TABLE repo_roots (
    did         text        PRIMARY KEY,
    commit_cid  bytea       NOT NULL,
    commit_data bytea       NOT NULL, -- the signed commit block (DAG-CBOR)
    data_cid    bytea       NOT NULL, -- MST root
    rev         text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- MST nodes of each repo's current tree, and nothing else: every commit deletes
-- the nodes it replaced, so loading a tree is one query over this table and a
-- full export is this table plus records plus the commit block.
CREATE TABLE repo_nodes (
    did  text  NOT NULL,
    cid  bytea NOT NULL,
    rev  text  NOT NULL, -- rev of the commit that wrote it (for getRepo ?since)
    data bytea NOT NULL,
    PRIMARY KEY (did, cid)
);

-- The record index and the record blocks in one row: getRecord is one lookup.
CREATE TABLE records (
    did        text  NOT NULL,
    collection text  NOT NULL,
    rkey       text  NOT NULL,
    cid        bytea NOT NULL,
    rev        text  NOT NULL,
    data       bytea NOT NULL, -- DAG-CBOR record block
    PRIMARY KEY (did, collection, rkey)
);
CREATE INDEX records_did_cid ON records (did, cid);

-- The event log behind subscribeRepos. Writers insert with seq NULL inside
-- their commit transaction; the sequencer (firehose package) assigns seqs to
-- committed rows in id order, one batch per transaction, so a reader that
-- reads "seq > cursor" can never pass over an event that commits later.
CREATE TABLE events (
    id          bigserial   PRIMARY KEY,
    seq         bigint      UNIQUE,
    did         text        NOT NULL,
    kind        text        NOT NULL, -- commit | sync | identity | account
    rev         text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    body        bytea       NOT NULL, -- DAG-CBOR event body; seq is a 9-byte placeholder
    seq_offset  integer     NOT NULL, -- where the placeholder starts in body
    blocks_len  integer     NOT NULL DEFAULT 0,
    ops_count   integer     NOT NULL DEFAULT 0,
    invalidated boolean     NOT NULL DEFAULT false
);
CREATE INDEX events_unsequenced ON events (id) WHERE seq IS NULL;
-- Cursor resolution reads only these two columns: an index-only scan.
CREATE INDEX events_seq_created ON events (seq) INCLUDE (created_at) WHERE seq IS NOT NULL;
CREATE INDEX events_created ON events (created_at);
CREATE INDEX events_did ON events (did, seq);

-- The sequencer's high-water mark. One row; its row lock serialises batches
-- even if two processes ever believe they lead.
CREATE TABLE sequencer_state (
    id       integer PRIMARY KEY CHECK (id = 1),
    last_seq bigint  NOT NULL
);
INSERT INTO sequencer_state (id, last_seq) VALUES (1, 0);

-- +goose Down
DROP TABLE sequencer_state;
DROP TABLE events;
DROP TABLE records;
DROP TABLE repo_nodes;
DROP TABLE repo_roots;
