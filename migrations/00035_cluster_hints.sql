-- +goose Up

-- The UDP address each node reads the other nodes' commit hints on
-- (cluster/hints.go); empty when it reads none.
ALTER TABLE cluster_nodes ADD COLUMN hint_addr text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE cluster_nodes DROP COLUMN hint_addr;
