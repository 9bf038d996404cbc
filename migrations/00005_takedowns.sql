-- +goose Up

-- Administrators' takedowns (com.atproto.admin.updateSubjectStatus). An
-- account's takedown is its status in accounts; the row here only keeps the
-- ref the administrator gave. A record or blob takedown lives only here: the
-- read methods look it up before serving, so it survives the record being
-- rewritten or the blob being uploaded again, until it is reversed.
CREATE TABLE takedowns (
    did        text        NOT NULL REFERENCES accounts (did) ON DELETE CASCADE,
    kind       text        NOT NULL CHECK (kind IN ('account', 'record', 'blob')),
    -- '' for the account, collection/rkey for a record, the CID for a blob.
    subject    text        NOT NULL,
    -- The record CID the administrator named ('' otherwise).
    cid        text        NOT NULL DEFAULT '',
    ref        text        NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (did, kind, subject)
);

-- The note an administrator gave when enabling or disabling an account's
-- invites (admin.enable/disableAccountInvites; accountView.inviteNote).
ALTER TABLE accounts ADD COLUMN invite_note text;

-- +goose Down
ALTER TABLE accounts DROP COLUMN invite_note;
DROP TABLE takedowns;
