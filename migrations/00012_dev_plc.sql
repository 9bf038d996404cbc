-- +goose Up

-- The development PLC directory that `bulwark serve` runs in process when
-- its host name is local and no PLC URL is set (package plc/plctest). One
-- row per accepted operation; seq is the operation's place in its DID's
-- log, from 0, so two servers on one database cannot both append the same
-- place (the loser is told to retry). Empty on a production server.
CREATE TABLE dev_plc_operations (
    did        text        NOT NULL,
    seq        integer     NOT NULL CHECK (seq >= 0),
    cid        text        NOT NULL,
    operation  jsonb       NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (did, seq)
);

-- +goose Down
DROP TABLE dev_plc_operations;
