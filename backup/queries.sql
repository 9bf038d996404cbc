-- Statements backup and restore run on the database they read or fill.

-- name: ServerVersionNum
-- 150018 for 15.18: the major version is what picks pg_dump and pg_restore.
SELECT current_setting('server_version_num')::int;

-- name: UserRelationCount
-- Tables, views, sequences and the like outside the system schemas: a
-- database with none is empty enough to restore into.
SELECT count(*)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
  AND n.nspname <> 'information_schema'
  AND n.nspname NOT LIKE 'pg\_%';
