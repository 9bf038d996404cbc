-- +goose Up

-- A commit writes its event row twice (insert, then the sequencer's seq
-- update), so every index on events is paid for twice per commit. Keep only
-- what a query needs: the primary key, the sequencer's queue of unnumbered
-- events, and one unique index on seq (it also serves cursor resolution,
-- retention and backfill). The per-column UNIQUE on seq indexed every
-- unnumbered row's NULL too; events_created and events_did served no query
-- that the seq index does not (retention walks seq order, which follows
-- created_at).
ALTER TABLE events DROP CONSTRAINT events_seq_key;
DROP INDEX events_seq_created;
CREATE UNIQUE INDEX events_seq_created ON events (seq) INCLUDE (created_at) WHERE seq IS NOT NULL;
DROP INDEX events_created;
DROP INDEX events_did;

-- Event bodies (a commit's CAR) compress to about half; lz4 does it for a
-- fraction of pglz's CPU. A server built without lz4 keeps pglz.
-- +goose StatementBegin
DO $$
BEGIN
    ALTER TABLE events ALTER COLUMN body SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
    RAISE NOTICE 'lz4 not available; events.body keeps the default compression';
END
$$;
-- +goose StatementEnd

-- The one-round-trip commit's guard and root update in one statement: it
-- moves did's root from p_old to the new commit, or raises SQLSTATE BW001
-- (and so aborts the commit) when the repo's commit is not p_old. The UPDATE
-- takes the row lock, so concurrent writers of one repo still serialise
-- here, before any other write of the commit.
-- +goose StatementBegin
CREATE FUNCTION bulwark_swap_root(p_did text, p_old bytea, p_commit bytea, p_commit_data bytea, p_data bytea, p_rev text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE repo_roots
    SET commit_cid = p_commit, commit_data = p_commit_data, data_cid = p_data, rev = p_rev, updated_at = now()
    WHERE did = p_did AND commit_cid = p_old;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'repository % moved on', p_did USING ERRCODE = 'BW001';
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION bulwark_guard_root(text, bytea);

-- One sequencer batch as one statement (so one round trip and one implicit
-- transaction): lock the high-water mark, number the oldest committed
-- unnumbered events in id order, move the mark, notify listeners (delivered
-- at commit). Returns no row when there was nothing to number.
-- +goose StatementBegin
CREATE FUNCTION bulwark_sequence(p_limit integer)
RETURNS TABLE (numbered bigint, last_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    base bigint;
    n bigint;
    top bigint;
BEGIN
    -- An idle poll must not lock (and so write and flush) anything.
    IF NOT EXISTS (SELECT 1 FROM events e WHERE e.seq IS NULL) THEN
        RETURN;
    END IF;
    SELECT s.last_seq INTO base FROM sequencer_state s WHERE s.id = 1 FOR UPDATE;
    WITH p AS (
        SELECT e.id, row_number() OVER (ORDER BY e.id) AS rn
        FROM events e
        WHERE e.seq IS NULL
        ORDER BY e.id
        LIMIT p_limit
    ), u AS (
        UPDATE events e SET seq = base + p.rn FROM p WHERE e.id = p.id RETURNING e.seq
    )
    SELECT count(*), max(u.seq) INTO n, top FROM u;
    IF n = 0 THEN
        RETURN;
    END IF;
    UPDATE sequencer_state s SET last_seq = top WHERE s.id = 1;
    PERFORM pg_notify('bulwark_sequenced', top::text);
    numbered := n;
    last_seq := top;
    RETURN NEXT;
END
$$;
-- +goose StatementEnd

-- A write's session check, run as the first statement of its commit
-- transaction (so it costs no round trip of its own): raises SQLSTATE
-- BW002 unless the account is active and the access token's session is
-- alive. The caller then looks up which of the two failed.
-- +goose StatementBegin
CREATE FUNCTION bulwark_check_session(p_did text, p_session text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM accounts a
        WHERE a.did = p_did AND a.status = 'active'
          AND EXISTS (SELECT 1 FROM refresh_tokens r
                      WHERE r.session_id = p_session AND r.did = a.did AND r.expires_at > now())
    ) THEN
        RAISE EXCEPTION 'session of % is over or the account is not active', p_did USING ERRCODE = 'BW002';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION bulwark_check_session(text, text);
DROP FUNCTION bulwark_sequence(integer);
-- +goose StatementBegin
CREATE FUNCTION bulwark_guard_root(p_did text, p_commit bytea) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    cur bytea;
BEGIN
    SELECT commit_cid INTO cur FROM repo_roots WHERE did = p_did FOR UPDATE;
    IF cur IS DISTINCT FROM p_commit THEN
        RAISE EXCEPTION 'repository % moved on', p_did USING ERRCODE = 'BW001';
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION bulwark_swap_root(text, bytea, bytea, bytea, bytea, text);
ALTER TABLE events ALTER COLUMN body SET COMPRESSION default;
CREATE INDEX events_did ON events (did, seq);
CREATE INDEX events_created ON events (created_at);
DROP INDEX events_seq_created;
CREATE INDEX events_seq_created ON events (seq) INCLUDE (created_at) WHERE seq IS NOT NULL;
ALTER TABLE events ADD CONSTRAINT events_seq_key UNIQUE (seq);
