-- +goose Up

-- Used by the repository engine's one-round-trip commit: inside the commit's
-- transaction, lock the repo row and abort (SQLSTATE BW001) unless its
-- commit is the one the writer built on, so a commit prepared from a cached
-- tree is stored only if nobody wrote in between.
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

-- +goose Down
DROP FUNCTION bulwark_guard_root(text, bytea);
