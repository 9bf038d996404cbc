-- +goose Up

-- The CIDs of the MST nodes an MST node links to: its left subtree ("l")
-- and each entry's right subtree ("t"), read off its DAG-CBOR bytes. In
-- the canonical encoding every MST node has, such a link is the one-letter
-- key, tag 42 and a 37-byte string: a zero byte and a 36-byte CIDv1
-- (dag-cbor, sha2-256). Record links ("v") and null links ("t" or "l"
-- followed by f6) do not match. A match by chance inside a hash could
-- only name a node that is not there, or hide a real link: the caller
-- then finds a node missing and loads the tree whole.
-- +goose StatementBegin
CREATE FUNCTION bulwark_mst_links(p_node bytea) RETURNS SETOF bytea
LANGUAGE plpgsql IMMUTABLE STRICT ROWS 8 AS $$
DECLARE
    pat bytea;
    off integer;
    i integer;
BEGIN
    FOREACH pat IN ARRAY ARRAY['\x616cd82a582500'::bytea, '\x6174d82a582500'::bytea] LOOP
        off := 0;
        LOOP
            i := position(pat IN substring(p_node FROM off + 1));
            EXIT WHEN i = 0;
            off := off + i - 1 + length(pat);
            RETURN NEXT substring(p_node FROM off + 1 FOR 36);
            off := off + 36;
        END LOOP;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- What a node's cached tree of a repository lacks when another node has
-- moved the repository on, as MST nodes, for when the records written
-- since (bulwark_repo_since, below) do not make the tree: NULL while the
-- root is still at commit p_old; otherwise the root's commit CID, MST
-- root CID and rev, then the CIDs and then the blocks of the MST nodes
-- written after p_old_rev (TIDs compare as bytes). Those are the nodes of
-- the current tree whose rev is newer, and every ancestor of such a node
-- is newer too (writing a node rewrites the path above it), so they are
-- found from the root down, one primary-key probe per link of a new node:
-- a few dozen probes for a commit or two behind, whatever the size of the
-- repository. (A filter on rev over the repository's nodes would read
-- every one of them: repo_nodes has no index on rev, which would cost
-- every commit an index entry per node.) STABLE: the root and the nodes
-- are read in one snapshot.
-- +goose StatementBegin
CREATE FUNCTION bulwark_repo_nodes_since(p_did text, p_old bytea, p_old_rev text)
RETURNS bytea[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
    moved bytea[];
BEGIN
    SELECT rr.commit_cid, rr.data_cid, rr.rev INTO r FROM repo_roots rr WHERE rr.did = p_did;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'repository % is gone', p_did USING ERRCODE = 'BW001';
    END IF;
    IF r.commit_cid = p_old THEN
        RETURN NULL;
    END IF;
    WITH RECURSIVE fresh(cid, data) AS (
        SELECT n.cid, n.data FROM repo_nodes n
        WHERE n.did = p_did AND n.cid = r.data_cid AND n.rev COLLATE "C" > p_old_rev COLLATE "C"
        UNION ALL
        SELECT n.cid, n.data
        FROM fresh f
        CROSS JOIN LATERAL bulwark_mst_links(f.data) AS l(cid)
        -- A probe per link: LIMIT keeps the planner from turning the
        -- join into a scan of every node of the repository.
        CROSS JOIN LATERAL (
            SELECT n.cid, n.data FROM repo_nodes n
            WHERE n.did = p_did AND n.cid = l.cid AND n.rev COLLATE "C" > p_old_rev COLLATE "C"
            LIMIT 1
        ) n
    )
    SELECT ARRAY[r.commit_cid, r.data_cid, convert_to(r.rev, 'UTF8')]
           || coalesce(array_agg(f.cid ORDER BY f.cid), '{}')
           || coalesce(array_agg(f.data ORDER BY f.cid), '{}')
    INTO moved
    FROM fresh f;
    RETURN moved;
END
$$;
-- +goose StatementEnd

-- What a node's cached tree of a repository lacks when another node has
-- moved the repository on, as records: NULL while the root is still at
-- commit p_old; otherwise the root's commit CID, MST root CID and rev,
-- then the paths (collection/rkey) and then the CIDs of the records
-- written after p_old_rev, found through records_did_rev (00022) as
-- repo.RecordsSince finds them. Applied to the cached tree they make the
-- stored one when every change since was a create or an update, which
-- the caller checks against the root CID; a delete leaves no row, and
-- the caller then asks bulwark_repo_nodes_since. More than 64 records
-- are not sent (the answer is the root alone): the nodes are then the
-- cheaper answer.
-- +goose StatementBegin
CREATE FUNCTION bulwark_repo_since(p_did text, p_old bytea, p_old_rev text)
RETURNS bytea[] LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
    paths bytea[];
    cids bytea[];
BEGIN
    SELECT rr.commit_cid, rr.data_cid, rr.rev INTO r FROM repo_roots rr WHERE rr.did = p_did;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'repository % is gone', p_did USING ERRCODE = 'BW001';
    END IF;
    IF r.commit_cid = p_old THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(convert_to(s.collection || '/' || s.rkey, 'UTF8')), array_agg(s.cid)
    INTO paths, cids
    FROM (SELECT rc.collection, rc.rkey, rc.cid FROM records rc
          WHERE rc.did = p_did AND rc.rev > p_old_rev LIMIT 65) s;
    IF cardinality(paths) > 64 THEN
        paths := NULL;
        cids := NULL;
    END IF;
    RETURN ARRAY[r.commit_cid, r.data_cid, convert_to(r.rev, 'UTF8')]
           || coalesce(paths, '{}') || coalesce(cids, '{}');
END
$$;
-- +goose StatementEnd

-- bulwark_try_commit (migrations/00019) answering a moved root with
-- bulwark_repo_since: what the cached tree lacks, found without reading
-- every node of the repository.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bulwark_try_commit(
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
        moved := bulwark_repo_since(p_did, p_old, p_old_rev);
        IF moved IS NULL THEN
            -- Cannot be (a commit CID never comes back); an empty answer
            -- sends the writer to the locked path.
            moved := '{}';
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION bulwark_try_commit(
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
DROP FUNCTION bulwark_repo_since(text, bytea, text);
DROP FUNCTION bulwark_repo_nodes_since(text, bytea, text);
DROP FUNCTION bulwark_mst_links(bytea);
