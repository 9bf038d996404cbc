-- Statements the managed cluster runs against its own maintenance database.

-- name: DatabaseExists
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1);

-- name: CreateDatabase
-- CREATE DATABASE takes no bind parameters: %s is a pgx.Identifier,
-- sanitised by the caller.
CREATE DATABASE %s;
