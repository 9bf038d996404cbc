-- +goose Up

-- A commit in two statements of one pipeline, so that the server stores
-- the tree while the writer signs (repo/overlap.go): bulwark_commit_tree
-- takes the repo row lock and checks the root (or raises BW001, as
-- bulwark_commit does, before any other write), drops the replaced MST
-- nodes and writes the new ones and the records; bulwark_commit_head,
-- sent once the commit is signed, moves the root and appends the event.
-- Together they do what bulwark_commit (migrations/00008) does; keep the
-- three in step.
-- +goose StatementBegin
CREATE FUNCTION bulwark_commit_tree(
    p_did text, p_old bytea, p_rev text,
    p_rm_nodes bytea[], p_node_cids bytea[], p_node_data bytea[],
    p_del_cols text[], p_del_rkeys text[],
    p_up_cols text[], p_up_rkeys text[], p_up_cids bytea[], p_up_data bytea[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k bytea;
BEGIN
    PERFORM 1 FROM repo_roots WHERE did = p_did AND commit_cid = p_old FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'repository % moved on', p_did USING ERRCODE = 'BW001';
    END IF;

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
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION bulwark_commit_head(
    p_did text, p_commit bytea, p_commit_data bytea, p_data bytea, p_rev text,
    p_ev_kind text, p_ev_rev text, p_ev_body bytea, p_ev_seq_offset integer, p_ev_blocks_len integer, p_ev_ops integer
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE repo_roots
    SET commit_cid = p_commit, commit_data = p_commit_data, data_cid = p_data, rev = p_rev, updated_at = now()
    WHERE did = p_did;

    INSERT INTO events (did, kind, rev, body, seq_offset, blocks_len, ops_count)
    VALUES (p_did, p_ev_kind, p_ev_rev, p_ev_body, p_ev_seq_offset, p_ev_blocks_len, p_ev_ops);
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION bulwark_commit_head(text, bytea, bytea, bytea, text, text, text, bytea, integer, integer, integer);
DROP FUNCTION bulwark_commit_tree(text, bytea, text, bytea[], bytea[], bytea[], text[], text[], text[], text[], bytea[], bytea[]);
