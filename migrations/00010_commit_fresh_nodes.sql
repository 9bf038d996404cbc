-- +goose Up

-- bulwark_commit (migrations/00008) with one more argument, p_fresh_nodes:
-- whether the commit's MST nodes are known not to be stored yet, so they
-- can be inserted without ON CONFLICT (an interleaved A/B of a lone
-- writer's commits, repo benchmarks: 25-35 µs less per commit at p50).
DROP FUNCTION bulwark_commit(text, bytea, bytea, bytea, bytea, text, bytea[], bytea[], bytea[], text[], text[], text[], text[], bytea[], bytea[], text, text, bytea, integer, integer, integer);
-- +goose StatementBegin
CREATE FUNCTION bulwark_commit(
    p_did text, p_old bytea, p_commit bytea, p_commit_data bytea, p_data bytea, p_rev text,
    p_rm_nodes bytea[], p_node_cids bytea[], p_node_data bytea[],
    p_del_cols text[], p_del_rkeys text[],
    p_up_cols text[], p_up_rkeys text[], p_up_cids bytea[], p_up_data bytea[],
    p_ev_kind text, p_ev_rev text, p_ev_body bytea, p_ev_seq_offset integer, p_ev_blocks_len integer, p_ev_ops integer,
    p_fresh_nodes boolean
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k bytea;
BEGIN
    UPDATE repo_roots
    SET commit_cid = p_commit, commit_data = p_commit_data, data_cid = p_data, rev = p_rev, updated_at = now()
    WHERE did = p_did AND commit_cid = p_old;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'repository % moved on', p_did USING ERRCODE = 'BW001';
    END IF;

    -- One primary-key probe per key: a plan that cannot go wrong, so the
    -- plan cache settles on one generic plan after a few calls (a delete
    -- over unnest() of the array kept being planned afresh, ~40 µs a call,
    -- and its generic plan read every node of the repo).
    FOREACH k IN ARRAY coalesce(p_rm_nodes, '{}') LOOP
        DELETE FROM repo_nodes WHERE did = p_did AND cid = k;
    END LOOP;

    -- A writer building on its cached tree knows its new nodes are not
    -- stored (the cache holds exactly the stored nodes of the root it
    -- moves from), and a plain insert skips speculative insertion's second
    -- index probe and WAL records; if one is there after all, the commit
    -- fails with a unique violation and the writer redoes it on the locked
    -- path, which passes false.
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
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION bulwark_commit(text, bytea, bytea, bytea, bytea, text, bytea[], bytea[], bytea[], text[], text[], text[], text[], bytea[], bytea[], text, text, bytea, integer, integer, integer, boolean);
-- +goose StatementBegin
CREATE FUNCTION bulwark_commit(
    p_did text, p_old bytea, p_commit bytea, p_commit_data bytea, p_data bytea, p_rev text,
    p_rm_nodes bytea[], p_node_cids bytea[], p_node_data bytea[],
    p_del_cols text[], p_del_rkeys text[],
    p_up_cols text[], p_up_rkeys text[], p_up_cids bytea[], p_up_data bytea[],
    p_ev_kind text, p_ev_rev text, p_ev_body bytea, p_ev_seq_offset integer, p_ev_blocks_len integer, p_ev_ops integer
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k bytea;
BEGIN
    UPDATE repo_roots
    SET commit_cid = p_commit, commit_data = p_commit_data, data_cid = p_data, rev = p_rev, updated_at = now()
    WHERE did = p_did AND commit_cid = p_old;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'repository % moved on', p_did USING ERRCODE = 'BW001';
    END IF;

    -- One primary-key probe per key: a plan that cannot go wrong, so the
    -- plan cache settles on one generic plan after a few calls (a delete
    -- over unnest() of the array kept being planned afresh, ~40 µs a call,
    -- and its generic plan read every node of the repo).
    FOREACH k IN ARRAY coalesce(p_rm_nodes, '{}') LOOP
        DELETE FROM repo_nodes WHERE did = p_did AND cid = k;
    END LOOP;

    INSERT INTO repo_nodes (did, cid, rev, data)
    SELECT p_did, t.cid, p_rev, t.data FROM unnest(p_node_cids, p_node_data) AS t(cid, data)
    ON CONFLICT (did, cid) DO NOTHING;

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
END
$$;
-- +goose StatementEnd
