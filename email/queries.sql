-- name: UpsertToken
-- A new request replaces the account's previous code for the purpose.
INSERT INTO email_tokens (did, purpose, code_hash, requested_at, expires_at)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (did, purpose) DO UPDATE
SET code_hash = excluded.code_hash, requested_at = excluded.requested_at, expires_at = excluded.expires_at,
    failures = 0;

-- name: TokenIssued
SELECT requested_at, expires_at FROM email_tokens WHERE did = $1 AND purpose = $2;

-- name: CountTokenFailure
UPDATE email_tokens SET failures = failures + 1 WHERE did = $1 AND purpose = $2
RETURNING failures;

-- name: LockToken
SELECT code_hash, expires_at FROM email_tokens WHERE did = $1 AND purpose = $2 FOR UPDATE;

-- name: LockTokenByCode
-- At most two rows, so that a (vanishingly unlikely) clash of two accounts'
-- codes is refused rather than resolved to either account.
SELECT did, expires_at FROM email_tokens WHERE purpose = $1 AND code_hash = $2 LIMIT 2 FOR UPDATE;

-- name: DeleteToken
DELETE FROM email_tokens WHERE did = $1 AND purpose = $2;

-- name: DeleteAccountTokens
DELETE FROM email_tokens WHERE did = $1;

-- name: CancelAccountTokenMail
UPDATE email_outbox
SET state = 'cancelled', note = $2, code = NULL, updated_at = $3
WHERE did = $1 AND code IS NOT NULL AND state IN ('held', 'pending');

-- name: DeleteExpiredTokens
DELETE FROM email_tokens WHERE expires_at < $1;

-- name: CancelTokenMail
-- The code of (did, purpose) was used or replaced: mail not yet sent is not
-- worth sending, and no row keeps the plain code any longer.
-- (Sent, failed and cancelled rows hold no code.)
UPDATE email_outbox
SET state = 'cancelled', note = $3, code = NULL, updated_at = $4
WHERE did = $1 AND purpose = $2 AND code IS NOT NULL AND state IN ('held', 'pending');

-- name: PendingTokens
SELECT purpose, code, expires_at FROM email_outbox
WHERE did = $1 AND code IS NOT NULL AND state IN ('held', 'pending') AND expires_at > $2
ORDER BY id;

-- name: InsertMessage
-- The NOTIFY is delivered when the caller's transaction commits, and wakes
-- the workers of every node.
WITH ins AS (
    INSERT INTO email_outbox (state, kind, did, recipient, purpose, code, expires_at, data,
                              next_attempt_at, created_at, updated_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $9)
    RETURNING id
)
SELECT id, pg_notify('bulwark_email', '') FROM ins;

-- name: ExpireMessages
-- Mail whose code has expired is not worth sending.
UPDATE email_outbox
SET state = 'cancelled', code = NULL, note = 'code expired before delivery', updated_at = $1
WHERE state IN ('held', 'pending') AND expires_at <= $1;

-- name: ClaimMessages
-- Takes up to $2 due messages and leases them until $3: another node skips
-- rows being claimed and finds these not due until the lease runs out, so a
-- node that dies mid-send leaves them to be retried. The attempt is counted
-- now, so a message that crashes its sender still runs out of attempts.
UPDATE email_outbox o
SET state = 'pending', attempts = o.attempts + 1, next_attempt_at = $3, updated_at = $1
FROM (
    SELECT id FROM email_outbox
    WHERE state IN ('held', 'pending') AND next_attempt_at <= $1
    ORDER BY next_attempt_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
) due
WHERE o.id = due.id
RETURNING o.id, o.kind, coalesce(o.did, ''), o.recipient, coalesce(o.purpose, ''), o.code,
          o.expires_at, o.data, o.attempts;

-- name: MarkSent
-- Unconditional: a message that went out is sent even if its code was used
-- meanwhile.
UPDATE email_outbox
SET state = 'sent', code = NULL, note = '', sent_at = $2, updated_at = $2
WHERE id = $1;

-- name: MarkRetry
UPDATE email_outbox
SET next_attempt_at = $2, note = $3, updated_at = $4
WHERE id = $1 AND state = 'pending';

-- name: ReleaseMessage
-- Hands back a claimed mail that was not tried (the worker is stopping):
-- its attempt does not count and any node may take it at once.
UPDATE email_outbox
SET attempts = attempts - 1, next_attempt_at = $2, updated_at = $2
WHERE id = $1 AND state = 'pending';

-- name: MarkFailed
UPDATE email_outbox
SET state = 'failed', code = NULL, note = $2, updated_at = $3
WHERE id = $1 AND state = 'pending';

-- name: PruneMessages
-- Deletes up to $3 rows in state $1 last touched before $2.
DELETE FROM email_outbox
WHERE id IN (
    SELECT id FROM email_outbox WHERE state = $1 AND updated_at < $2 LIMIT $3
);

-- name: CountByState
SELECT state, count(*) FROM email_outbox GROUP BY state;

-- name: ListenEmail
LISTEN bulwark_email;
