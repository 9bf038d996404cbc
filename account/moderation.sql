-- name: PutTakedown
INSERT INTO takedowns (did, kind, subject, cid, ref)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (did, kind, subject) DO UPDATE SET cid = EXCLUDED.cid, ref = EXCLUDED.ref;

-- name: DeleteTakedown
DELETE FROM takedowns WHERE did = $1 AND kind = $2 AND subject = $3;

-- name: GetTakedown
SELECT cid, ref, created_at FROM takedowns WHERE did = $1 AND kind = $2 AND subject = $3;

-- name: TakendownRecordKeys
-- The taken-down records of one collection: listRecords leaves them out.
SELECT subject FROM takedowns
WHERE did = $1 AND kind = 'record' AND starts_with(subject, $2 || '/');

-- name: SetInviteNote
UPDATE accounts SET invite_note = $2, updated_at = now() WHERE did = $1;

-- name: InviteNotes
SELECT did, coalesce(invite_note, '') FROM accounts WHERE did = ANY($1::text[]);

-- name: InviteCodesFor
SELECT c.code, c.available, c.disabled, c.for_account, c.created_by, c.created_at,
       coalesce(array_agg(u.used_by ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}'),
       coalesce(array_agg(u.used_at ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}')
FROM invite_codes c
LEFT JOIN invite_code_uses u ON u.code = c.code
WHERE c.for_account = ANY($1::text[])
GROUP BY c.code
ORDER BY c.created_at DESC, c.code DESC;

-- name: InviteCodesByCode
SELECT c.code, c.available, c.disabled, c.for_account, c.created_by, c.created_at,
       coalesce(array_agg(u.used_by ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}'),
       coalesce(array_agg(u.used_at ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}')
FROM invite_codes c
LEFT JOIN invite_code_uses u ON u.code = c.code
WHERE c.code = ANY($1::text[])
GROUP BY c.code;

-- name: InvitesUsedBy
SELECT used_by, code FROM invite_code_uses WHERE used_by = ANY($1::text[]);

-- name: ListInviteCodesByUsage
-- Most used first (then newest); the cursor is the last code of the
-- previous page. Invite codes are few, so counting every code's uses per
-- page is cheap.
WITH c AS (
    SELECT ic.*, (SELECT count(*) FROM invite_code_uses u WHERE u.code = ic.code) AS n
    FROM invite_codes ic
)
SELECT c.code, c.available, c.disabled, c.for_account, c.created_by, c.created_at,
       coalesce(array_agg(u.used_by ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}'),
       coalesce(array_agg(u.used_at ORDER BY u.used_at) FILTER (WHERE u.used_by IS NOT NULL), '{}')
FROM c
LEFT JOIN invite_code_uses u ON u.code = c.code
WHERE $1 = '' OR (c.n, c.created_at, c.code) < (SELECT n, created_at, code FROM c WHERE code = $1)
GROUP BY c.code, c.available, c.disabled, c.for_account, c.created_by, c.created_at, c.n
ORDER BY c.n DESC, c.created_at DESC, c.code DESC
LIMIT $2;
