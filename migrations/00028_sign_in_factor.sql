-- +goose Up

-- Email as a second sign-in factor (com.atproto.server.updateEmail's
-- emailAuthFactor): a password login also needs a code mailed to the
-- account's confirmed address. App passwords are not subject to it.
ALTER TABLE accounts ADD COLUMN email_auth_factor boolean NOT NULL DEFAULT false;

-- The sign-in code is a mailed code of its own purpose, usable for nothing
-- else; its wrong guesses are counted, and past a few the code is void.
ALTER TABLE email_tokens DROP CONSTRAINT email_tokens_purpose_check;
ALTER TABLE email_tokens ADD CONSTRAINT email_tokens_purpose_check CHECK (purpose IN
    ('confirm_email', 'update_email', 'reset_password', 'delete_account', 'plc_operation', 'sign_in'));
ALTER TABLE email_tokens ADD COLUMN failures integer NOT NULL DEFAULT 0;

-- A session a taken-down account opened to move away (createSession with
-- allowTakendown): its tokens reach only the methods that serve that, and
-- it is never refreshed, even after the takedown is lifted.
ALTER TABLE refresh_tokens ADD COLUMN takendown boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE refresh_tokens DROP COLUMN takendown;
DELETE FROM email_tokens WHERE purpose = 'sign_in';
ALTER TABLE email_tokens DROP COLUMN failures;
ALTER TABLE email_tokens DROP CONSTRAINT email_tokens_purpose_check;
ALTER TABLE email_tokens ADD CONSTRAINT email_tokens_purpose_check CHECK (purpose IN
    ('confirm_email', 'update_email', 'reset_password', 'delete_account', 'plc_operation'));
ALTER TABLE accounts DROP COLUMN email_auth_factor;
