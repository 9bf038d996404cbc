-- Statements dbtest runs on the maintenance database of the test server.
-- CREATE/DROP/ALTER DATABASE take no bind parameters: each %s is a
-- pgx.Identifier sanitised by the caller.

-- name: LockTemplate
SELECT pg_advisory_lock($1);

-- name: UnlockTemplate
SELECT pg_advisory_unlock($1);

-- name: TemplateState
SELECT datistemplate FROM pg_database WHERE datname = $1;

-- name: CreateDatabase
CREATE DATABASE %s;

-- name: ServerVersion
SELECT current_setting('server_version_num')::int;

-- name: CloneDatabase
CREATE DATABASE %s TEMPLATE %s;

-- name: CloneDatabaseFileCopy
-- Postgres 15+ copies a template through the WAL by default, which takes
-- ~150ms for our small template; a file copy takes ~20ms.
CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY;

-- name: SealTemplate
ALTER DATABASE %s WITH IS_TEMPLATE true ALLOW_CONNECTIONS false;

-- name: DropDatabase
DROP DATABASE IF EXISTS %s WITH (FORCE);
