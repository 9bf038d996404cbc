-- Rows the plan test adds to a populated database (package
-- internal/populate), for the tables populate leaves thin or empty: at the
-- sizes they reach on a server of tens of thousands of accounts, so that
-- Postgres plans queries on them as it would there (on a table of a few
-- pages a sequential scan is the right plan, and would hide a missing
-- index). $1 is how many rows each adds.

-- name: FillSomeAccounts
-- A thousand DIDs the fills below spread their rows over.
CREATE TEMP TABLE some_accounts AS
SELECT (row_number() OVER (ORDER BY did) - 1)::int AS n, did FROM (SELECT did FROM accounts ORDER BY did LIMIT 1000) a;

-- name: FillInviteCodes
INSERT INTO invite_codes (code, available, disabled, for_account, created_by, created_at)
SELECT 'plantest-' || g, g % 5, g % 50 = 0,
       CASE WHEN g % 10 = 0 THEN 'admin' ELSE a.did END, 'admin', now() - g * interval '1 minute'
FROM generate_series(1, $1::int) g
JOIN some_accounts a ON a.n = g % 1000;

-- name: FillInviteUses
INSERT INTO invite_code_uses (code, used_by, used_at)
SELECT c.code, a.did, c.created_at + interval '1 hour'
FROM (SELECT code, created_at, row_number() OVER (ORDER BY code) AS n FROM invite_codes WHERE available < 4) c
JOIN some_accounts a ON a.n = c.n % 1000
LIMIT $1::int;

-- name: FillTakedowns
INSERT INTO takedowns (did, kind, subject, cid, ref)
SELECT r.did, 'record', r.collection || '/' || r.rkey, '', 'plantest'
FROM records r TABLESAMPLE SYSTEM (10)
LIMIT $1::int
ON CONFLICT DO NOTHING;

-- name: FillAudit
INSERT INTO audit_log (at, actor, action, subject, reason)
SELECT now() - g * interval '1 minute', 'admin', 'account.takedown', a.did, 'plantest'
FROM generate_series(1, $1::int) g
JOIN some_accounts a ON a.n = g % 1000;

-- name: FillOAuthRequests
INSERT INTO oauth_requests (id, client_id, params, dpop_jkt, client_auth, code_hash, expires_at)
SELECT 'req-' || g, 'https://client.example/metadata.json', '{}', 'jkt', '{"method":"none"}',
       CASE WHEN g % 2 = 0 THEN sha256(g::text::bytea) END, now() + (g % 600 - 3) * interval '1 second'
FROM generate_series(1, $1::int) g;

-- name: FillOAuthGrants
INSERT INTO oauth_grants (id, did, client_id, scope, dpop_jkt, client_auth, refresh_hash, expires_at)
SELECT 'grant-plantest-' || g, a.did, 'https://client.example/metadata.json', 'atproto', 'jkt', '{"method":"none"}',
       sha256(('grant' || g)::bytea), now() + (g % 1000 - 5) * interval '1 hour'
FROM generate_series(1, $1::int) g
JOIN some_accounts a ON a.n = g % 1000;

-- name: FillOAuthSpent
INSERT INTO oauth_spent_refresh (hash, grant_id, expires_at)
SELECT sha256(('spent' || g)::bytea), gr.id, now() + (g % 100 - 1) * interval '1 hour'
FROM generate_series(1, $1::int) g
JOIN (SELECT (row_number() OVER (ORDER BY id) - 1)::int AS n, id FROM (SELECT id FROM oauth_grants ORDER BY id LIMIT 1000) x) gr ON gr.n = g % 1000;

-- name: FillOAuthValues
INSERT INTO oauth_used_values (kind, value, expires_at)
SELECT 'jti', sha256(('value' || g)::bytea), now() + (g % 600 - 3) * interval '1 second'
FROM generate_series(1, $1::int) g;

-- name: FillOAuthDevices
INSERT INTO oauth_devices (id, user_agent, expires_at)
SELECT sha256(('device' || g)::bytea), 'plantest', now() + (g % 1000 - 5) * interval '1 hour'
FROM generate_series(1, $1::int) g;

-- name: FillOAuthDeviceAccounts
INSERT INTO oauth_device_accounts (device_id, did, expires_at)
SELECT d.id, a.did, d.expires_at
FROM (SELECT id, expires_at, row_number() OVER (ORDER BY id) AS n FROM oauth_devices WHERE user_agent = 'plantest') d
JOIN some_accounts a ON a.n = d.n % 1000
LIMIT $1::int;

-- name: FillEmailTokens
INSERT INTO email_tokens (did, purpose, code_hash, requested_at, expires_at)
SELECT a.did, p.purpose, sha256((a.did || p.purpose)::bytea), now(), now() + (a.n % 100 - 1) * interval '1 hour'
FROM (SELECT did, row_number() OVER (ORDER BY did) AS n FROM accounts) a
CROSS JOIN (VALUES ('reset_password'), ('delete_account'), ('plc_operation')) p(purpose)
ORDER BY a.n
LIMIT $1::int
ON CONFLICT DO NOTHING;

-- name: FillOutbox
INSERT INTO email_outbox (state, kind, did, recipient, purpose, code, expires_at, next_attempt_at, created_at, updated_at, sent_at)
SELECT (ARRAY['sent', 'sent', 'sent', 'cancelled', 'failed', 'pending', 'held'])[g % 7 + 1], 'reset_password', a.did,
       'plantest@example.com', 'reset_password', CASE WHEN g % 7 >= 5 THEN 'code' END, now() + interval '1 hour',
       now() + (g % 60) * interval '1 minute', now() - g * interval '1 minute', now() - g * interval '1 minute', now()
FROM generate_series(1, $1::int) g
JOIN some_accounts a ON a.n = g % 1000;

-- name: FillAppPasswords
INSERT INTO app_passwords (did, name, password_hash, privileged)
SELECT a.did, 'plantest ' || k, sha256((a.did || k)::bytea), k = 2
FROM (SELECT did FROM accounts ORDER BY did LIMIT $1::int / 2) a
CROSS JOIN generate_series(1, 2) k
ON CONFLICT DO NOTHING;

-- name: FillTempBlobs
-- Uploaded blobs no record refers to yet (temp_since set).
INSERT INTO blobs (did, cid, mime, size, storage_key, temp_since)
SELECT a.did, 'bafkreiplantest' || g, 'image/png', 1000, 'bafkreiplantest' || g, now() - (g % 100) * interval '1 hour'
FROM generate_series(1, $1::int) g
JOIN some_accounts a ON a.n = g % 1000;

-- name: FillServiceAuthUsed
INSERT INTO service_auth_used (purpose, iss, jti, expires_at)
SELECT 'com.atproto.repo.uploadBlob', a.did, 'plantest-' || g, now() + (g % 120 - 60) * interval '1 minute'
FROM generate_series(1, $1::int) g
JOIN some_accounts a ON a.n = g % 1000;

-- name: FillEvents
-- The populated history again, $1 times over, under new seqs: a longer
-- log of the same shape.
INSERT INTO events (seq, did, kind, rev, created_at, body, seq_offset, blocks_len, ops_count)
SELECT e.seq + k * m.top, e.did, e.kind, e.rev, e.created_at + k * interval '1 minute', e.body, e.seq_offset, e.blocks_len, e.ops_count
FROM events e, (SELECT max(seq) AS top FROM events) m, generate_series(1, $1::int) k
WHERE e.seq IS NOT NULL;

-- name: FillRaiseSeq
UPDATE sequencer_state SET last_seq = (SELECT max(seq) FROM events) WHERE id = 1;

-- name: Analyze
ANALYZE;

-- name: GenericPlans
-- Plan as a connection does once it has run a statement a few times: the
-- plan pgx's statement cache then keeps reusing, whatever the arguments.
SET LOCAL plan_cache_mode = force_generic_plan;

-- name: Prepare
-- %s: the statement's name, then its SQL.
PREPARE %s AS %s;

-- name: ParamCount
SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = $1;

-- name: Explain
-- %s: the statement's name and its arguments, all NULL (a generic plan
-- does not depend on them).
EXPLAIN (FORMAT JSON) EXECUTE %s%s;

-- name: Deallocate
DEALLOCATE %s;

-- name: MiddleRepo
-- The DID half way through repo_roots: a cursor deep into a walk.
SELECT did FROM repo_roots ORDER BY did OFFSET (SELECT count(*) / 2 FROM repo_roots) LIMIT 1;

-- name: MiddleRecord
-- The largest account's DID and the rkey half way through its likes.
SELECT did, rkey FROM (
    SELECT did, rkey, row_number() OVER (ORDER BY rkey) AS i, count(*) OVER () AS n
    FROM records
    WHERE did = (SELECT did FROM records GROUP BY did ORDER BY count(*) DESC LIMIT 1)
      AND collection = 'app.bsky.feed.like'
) r WHERE i = n / 2;

-- name: MiddleSeq
SELECT seq FROM events WHERE seq IS NOT NULL ORDER BY seq OFFSET (SELECT count(*) / 2 FROM events) LIMIT 1;

-- name: ExplainAnalyze
-- %s: the statement's name and its arguments.
EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE %s%s;
