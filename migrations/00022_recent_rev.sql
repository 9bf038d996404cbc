-- +goose Up

-- Read-after-write (repo.RecordsSince) asks for an account's records
-- written after a revision: the app view's, which lags behind. This index
-- finds them without walking every record of the account.
CREATE INDEX records_did_rev ON records (did, rev);

-- The revision of a repository's first commit here (its genesis, or for
-- an account that moved in, the commit that created it here). An app
-- view revision older than it is another server's, so records that look
-- newer are not news to the caller; one at it or later is this
-- repository's own, however few records the repository had then.
ALTER TABLE repo_roots ADD COLUMN first_rev text;

-- +goose StatementBegin
CREATE FUNCTION repo_roots_first_rev() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.first_rev := COALESCE(NEW.first_rev, NEW.rev);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER repo_roots_first_rev BEFORE INSERT ON repo_roots
    FOR EACH ROW EXECUTE FUNCTION repo_roots_first_rev();

-- Repositories already here: the oldest revision anything of theirs still
-- carries, their current revision at most.
UPDATE repo_roots r SET first_rev = LEAST(r.rev,
    (SELECT min(rev) FROM records WHERE did = r.did),
    (SELECT min(rev) FROM events WHERE did = r.did AND rev IS NOT NULL));

-- +goose Down
DROP TRIGGER repo_roots_first_rev ON repo_roots;
DROP FUNCTION repo_roots_first_rev();
ALTER TABLE repo_roots DROP COLUMN first_rev;
DROP INDEX records_did_rev;
