-- Bookkeeping of bulwark-load populate (package internal/populate), kept in
-- the populated database itself so that a run stopped at any point (kill
-- -9 included) continues where it stopped: a batch's accounts and its row
-- here commit in one transaction.

-- name: CreateBatches
CREATE TABLE IF NOT EXISTS populate_batches (
    first    integer     PRIMARY KEY,
    count    integer     NOT NULL,
    records  bigint      NOT NULL,
    done_at  timestamptz NOT NULL DEFAULT now()
);

-- name: CreateSettings
-- The shape settings of the first run: a later run must use the same, or
-- the accounts it adds would not follow one distribution.
CREATE TABLE IF NOT EXISTS populate_settings (
    id          integer PRIMARY KEY CHECK (id = 1),
    seed        bigint  NOT NULL,
    realistic   integer NOT NULL,
    largest     integer NOT NULL,
    handles     text    NOT NULL,
    public_url  text    NOT NULL,
    history     bigint  NOT NULL DEFAULT 0
);

-- name: InsertSettings
INSERT INTO populate_settings (id, seed, realistic, largest, handles, public_url)
VALUES (1, $1, $2, $3, $4, $5)
ON CONFLICT (id) DO NOTHING;

-- name: GetSettings
SELECT seed, realistic, largest, handles, public_url, history FROM populate_settings WHERE id = 1;

-- name: DoneBatches
SELECT first, count FROM populate_batches ORDER BY first;

-- name: InsertBatch
INSERT INTO populate_batches (first, count, records) VALUES ($1, $2, $3);

-- name: BatchTotals
SELECT coalesce(sum(count), 0), coalesce(sum(records), 0) FROM populate_batches;

-- name: AddHistory
UPDATE populate_settings SET history = history + $1 WHERE id = 1;

-- name: AccountOfIndex
SELECT did FROM accounts WHERE handle = $1;

-- name: AsyncCommit
-- First in a batch's transaction (see store in copy.go).
SET LOCAL synchronous_commit = off;
