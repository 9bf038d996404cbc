-- +goose Up

-- Every admin write and firehose repair, with who did it and what changed.
CREATE TABLE audit_log (
    id      bigserial   PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL,
    action  text        NOT NULL,
    subject text        NOT NULL,
    before  jsonb,
    after   jsonb,
    reason  text        NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_subject ON audit_log (subject, id);

-- +goose Down
DROP TABLE audit_log;
