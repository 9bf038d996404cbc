-- +goose Up

-- Codes mailed to account holders (confirm an address, reset a password,
-- sign a PLC operation ...). One live code per account and purpose: a new
-- request replaces the old one. Only a SHA-256 of the code is kept; the
-- plain code lives in the outbox row that carries it, until that mail is
-- sent or the code is used, replaced or expires.
CREATE TABLE email_tokens (
    did          text        NOT NULL REFERENCES accounts (did) ON DELETE CASCADE,
    purpose      text        NOT NULL CHECK (purpose IN
                 ('confirm_email', 'update_email', 'reset_password', 'delete_account', 'plc_operation')),
    code_hash    bytea       NOT NULL,
    requested_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (did, purpose)
);
-- resetPassword names no account: the code alone finds it.
CREATE INDEX email_tokens_code ON email_tokens (purpose, code_hash);
CREATE INDEX email_tokens_expiry ON email_tokens (expires_at);

-- Outgoing mail. A row is written in the transaction of the request that
-- causes it and sent later by a worker on any node, so an unreachable mail
-- server delays mail instead of failing the request.
--
--   held       written while no SMTP server was configured; sent once one is
--   pending    waiting for its next attempt (next_attempt_at)
--   sent       delivered to the SMTP server
--   failed     gave up after the last attempt (kept for inspection)
--   cancelled  not worth sending: its code was used, replaced or expired
CREATE TABLE email_outbox (
    id              bigserial   PRIMARY KEY,
    state           text        NOT NULL CHECK (state IN ('held', 'pending', 'sent', 'failed', 'cancelled')),
    kind            text        NOT NULL,
    did             text        REFERENCES accounts (did) ON DELETE CASCADE,
    recipient       text        NOT NULL,
    -- Token mails: the purpose, the plain code (NULL once it must no longer
    -- be readable) and when the code expires.
    purpose         text,
    code            text,
    expires_at      timestamptz,
    -- Handle, and the subject and content of an administrator's message.
    data            jsonb       NOT NULL DEFAULT '{}',
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    -- Why the last attempt failed, or why the row was cancelled.
    note            text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    sent_at         timestamptz
);
CREATE INDEX email_outbox_due ON email_outbox (next_attempt_at, id) WHERE state IN ('held', 'pending');
CREATE INDEX email_outbox_codes ON email_outbox (did, purpose) WHERE code IS NOT NULL;
CREATE INDEX email_outbox_expiry ON email_outbox (expires_at) WHERE state IN ('held', 'pending') AND expires_at IS NOT NULL;
CREATE INDEX email_outbox_done ON email_outbox (state, updated_at) WHERE state IN ('sent', 'failed', 'cancelled');

-- +goose Down
DROP TABLE email_outbox;
DROP TABLE email_tokens;
