-- +goose Up

-- Leases of the jobs one node of a cluster runs at a time (the sequencer,
-- retention, blob collection, the relay watch, ...). The holder renews
-- expires_at every tick; any node takes over a lease whose expiry has
-- passed, raising its epoch. Expiry is compared with the database's clock,
-- so the nodes' clocks do not matter. holder_key is the advisory lock the
-- holder's process keeps on a session of its own while it lives: once that
-- session is gone (the process was killed, its host went down), the lease
-- is taken over at once instead of at its expiry. A job that publishes (the sequencer)
-- checks, in its own transaction, that the epoch is still the one it took
-- (bulwark_sequence below): a holder that was frozen or cut off and then
-- comes back cannot publish once another node has taken over.
CREATE TABLE cluster_leases (
    name        text        PRIMARY KEY,
    holder      text        NOT NULL DEFAULT '',
    holder_key  bigint      NOT NULL DEFAULT 0,
    epoch       bigint      NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);

-- The nodes of a cluster, one row per TID clock id (0-1023, the 10 bits a
-- TID has for it): a starting node claims the row seen longest ago, so
-- record keys and revs made on different nodes never collide. A running
-- node updates seen_at every second; facts are what every node must agree
-- on (fingerprints of secrets, the blob store), compared at start.
CREATE TABLE cluster_nodes (
    clock_id   integer     PRIMARY KEY CHECK (clock_id BETWEEN 0 AND 1023),
    node       text        NOT NULL DEFAULT '',
    host       text        NOT NULL DEFAULT '',
    version    text        NOT NULL DEFAULT '',
    started_at timestamptz,
    seen_at    timestamptz NOT NULL DEFAULT '-infinity',
    stopped_at timestamptz,
    facts      jsonb       NOT NULL DEFAULT '{}'
);
INSERT INTO cluster_nodes (clock_id) SELECT generate_series(0, 1023);

-- Facts that must never change for a database, whichever node starts: the
-- fingerprint of the PLC rotation key (it also seals every account's
-- signing key).
CREATE TABLE cluster_facts (
    name       text        PRIMARY KEY,
    value      text        NOT NULL,
    set_by     text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- bulwark_sequence (migrations/00007) fenced by a lease: with p_lease set,
-- the batch takes a share lock on the lease row and numbers nothing unless
-- the lease is still at p_epoch (SQLSTATE BW003 otherwise). A takeover
-- updates that row, so it waits for a batch in flight, and a batch after
-- it sees the new epoch: two holders never both number events. The
-- one-argument form stays for nodes of the previous version during a
-- rolling upgrade (their batches still serialise on sequencer_state).
-- +goose StatementBegin
CREATE FUNCTION bulwark_sequence(p_limit integer, p_lease text, p_epoch bigint)
RETURNS TABLE (numbered bigint, last_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
    base bigint;
    n bigint;
    top bigint;
    cur bigint;
BEGIN
    -- An idle poll must not lock (and so write and flush) anything.
    IF NOT EXISTS (SELECT 1 FROM events e WHERE e.seq IS NULL) THEN
        RETURN;
    END IF;
    IF p_lease IS NOT NULL THEN
        SELECT l.epoch INTO cur FROM cluster_leases l WHERE l.name = p_lease FOR SHARE;
        IF cur IS DISTINCT FROM p_epoch THEN
            RAISE EXCEPTION 'lease % is at epoch %, not %: another node took it over', p_lease, cur, p_epoch
                USING ERRCODE = 'BW003';
        END IF;
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

-- bulwark_commit (migrations/00010) for a writer building on its cached
-- tree, as several nodes writing one repository do: when the root has
-- moved it writes nothing and, instead of raising (which would roll back
-- every other commit of a group), returns what the writer needs to bring
-- its cache up to the stored root: the root's commit CID, MST root CID and
-- rev, then the CIDs and then the blocks of the MST nodes written since
-- p_old_rev (TIDs compare as bytes). NULL means the commit is stored. A
-- repository that is gone still raises BW001.
-- +goose StatementBegin
CREATE FUNCTION bulwark_try_commit(
    p_did text, p_old bytea, p_commit bytea, p_commit_data bytea, p_data bytea, p_rev text,
    p_rm_nodes bytea[], p_node_cids bytea[], p_node_data bytea[],
    p_del_cols text[], p_del_rkeys text[],
    p_up_cols text[], p_up_rkeys text[], p_up_cids bytea[], p_up_data bytea[],
    p_ev_kind text, p_ev_rev text, p_ev_body bytea, p_ev_seq_offset integer, p_ev_blocks_len integer, p_ev_ops integer,
    p_fresh_nodes boolean, p_old_rev text
) RETURNS bytea[] LANGUAGE plpgsql AS $$
DECLARE
    k bytea;
    moved bytea[];
BEGIN
    UPDATE repo_roots
    SET commit_cid = p_commit, commit_data = p_commit_data, data_cid = p_data, rev = p_rev, updated_at = now()
    WHERE did = p_did AND commit_cid = p_old;
    IF NOT FOUND THEN
        SELECT ARRAY[r.commit_cid, r.data_cid, convert_to(r.rev, 'UTF8')]
               || coalesce(array_agg(n.cid ORDER BY n.cid) FILTER (WHERE n.cid IS NOT NULL), '{}')
               || coalesce(array_agg(n.data ORDER BY n.cid) FILTER (WHERE n.cid IS NOT NULL), '{}')
        INTO moved
        FROM repo_roots r
        LEFT JOIN repo_nodes n ON n.did = r.did AND n.rev COLLATE "C" > p_old_rev COLLATE "C"
        WHERE r.did = p_did
        GROUP BY r.commit_cid, r.data_cid, r.rev;
        IF moved IS NULL THEN
            RAISE EXCEPTION 'repository % is gone', p_did USING ERRCODE = 'BW001';
        END IF;
        RETURN moved;
    END IF;

    FOREACH k IN ARRAY coalesce(p_rm_nodes, '{}') LOOP
        DELETE FROM repo_nodes WHERE did = p_did AND cid = k;
    END LOOP;

    IF p_fresh_nodes THEN
        INSERT INTO repo_nodes (did, cid, rev, data)
        SELECT p_did, t.cid, p_rev, t.data FROM unnest(p_node_cids, p_node_data) AS t(cid, data);
    ELSE
        INSERT INTO repo_nodes (did, cid, rev, data)
        SELECT p_did, t.cid, p_rev, t.data FROM unnest(p_node_cids, p_node_data) AS t(cid, data)
        ON CONFLICT (did, cid) DO NOTHING;
    END IF;

    FOR i IN 1 .. coalesce(cardinality(p_del_cols), 0) LOOP
        DELETE FROM records WHERE did = p_did AND collection = p_del_cols[i] AND rkey = p_del_rkeys[i];
    END LOOP;

    IF cardinality(p_up_cols) > 0 THEN
        INSERT INTO records (did, collection, rkey, cid, rev, data)
        SELECT p_did, t.collection, t.rkey, t.cid, p_rev, t.data
        FROM unnest(p_up_cols, p_up_rkeys, p_up_cids, p_up_data) AS t(collection, rkey, cid, data)
        ON CONFLICT (did, collection, rkey) DO UPDATE
        SET cid = excluded.cid, rev = excluded.rev, data = excluded.data;
    END IF;

    INSERT INTO events (did, kind, rev, body, seq_offset, blocks_len, ops_count)
    VALUES (p_did, p_ev_kind, p_ev_rev, p_ev_body, p_ev_seq_offset, p_ev_blocks_len, p_ev_ops);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION bulwark_try_commit(text, bytea, bytea, bytea, bytea, text, bytea[], bytea[], bytea[], text[], text[], text[], text[], bytea[], bytea[], text, text, bytea, integer, integer, integer, boolean, text);
DROP FUNCTION bulwark_sequence(integer, text, bigint);
DROP TABLE cluster_facts;
DROP TABLE cluster_nodes;
DROP TABLE cluster_leases;
