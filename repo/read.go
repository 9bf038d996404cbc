package repo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/ipld/go-car"
	"github.com/ipld/go-car/util"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

// Record is a stored record.
type Record struct {
	Collection syntax.NSID
	RKey       syntax.RecordKey
	CID        cid.Cid
	// Data is the record's DAG-CBOR block.
	Data []byte
}

// GetRecord returns one record of did's repository.
func (e *Engine) GetRecord(ctx context.Context, did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) (*Record, error) {
	var raw []byte
	rec := Record{Collection: collection, RKey: rkey}
	err := db.Translate(e.pool.QueryRow(ctx, qGetRecord, did.String(), collection.String(), rkey.String()).Scan(&raw, &rec.Data))
	if errors.Is(err, db.ErrNotFound) {
		return nil, fmt.Errorf("%w: at://%s/%s/%s", ErrRecordNotFound, did, collection, rkey)
	}
	if err != nil {
		return nil, fmt.Errorf("reading record: %w", err)
	}
	if rec.CID, err = cid.Cast(raw); err != nil {
		return nil, fmt.Errorf("%w: record cid: %v", ErrCorruptRepo, err)
	}
	return &rec, nil
}

// ListRecords returns up to limit records of one collection ordered by rkey,
// newest (highest rkey) first unless ascending, after cursor (an rkey; ""
// starts at the beginning). The page ends early where its records would
// hold more than maxBytes (at least one record always comes), so that
// what one call holds in memory is bounded whatever the records' sizes.
// The returned cursor is "" at the end.
func (e *Engine) ListRecords(ctx context.Context, did syntax.DID, collection syntax.NSID, cursor string, limit int, ascending bool, maxBytes int64) ([]Record, string, error) {
	var rows pgx.Rows
	var err error
	switch {
	case ascending:
		rows, err = e.pool.Query(ctx, qListRecordsAsc, did.String(), collection.String(), cursor, limit, maxBytes)
	case cursor == "":
		rows, err = e.pool.Query(ctx, qListNewest, did.String(), collection.String(), limit, maxBytes)
	default:
		rows, err = e.pool.Query(ctx, qListRecordsDesc, did.String(), collection.String(), cursor, limit, maxBytes)
	}
	if err != nil {
		return nil, "", fmt.Errorf("listing records: %w", db.Translate(err))
	}
	var out []Record
	var rkey string
	var raw, data []byte
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&rkey, &raw, &data, &n}, func() error {
		c, err := cid.Cast(raw)
		if err != nil {
			return fmt.Errorf("%w: record cid: %v", ErrCorruptRepo, err)
		}
		out = append(out, Record{Collection: collection, RKey: syntax.RecordKey(rkey), CID: c, Data: append([]byte(nil), data...)})
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("listing records: %w", db.Translate(err))
	}
	next := ""
	if len(out) > 0 && (int64(len(out)) < n || len(out) == limit) {
		next = out[len(out)-1].RKey.String()
	}
	return out, next, nil
}

// ListCollections returns the collections that hold records in did's repo.
func (e *Engine) ListCollections(ctx context.Context, did syntax.DID) ([]string, error) {
	rows, err := e.pool.Query(ctx, qListCollections, did.String())
	if err != nil {
		return nil, fmt.Errorf("listing collections: %w", db.Translate(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing collections: %w", db.Translate(err))
	}
	return out, nil
}

// CountRecords returns how many records did's repository holds.
func (e *Engine) CountRecords(ctx context.Context, did syntax.DID) (int64, error) {
	var n int64
	if err := e.pool.QueryRow(ctx, qCountRecords, did.String()).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting records: %w", db.Translate(err))
	}
	return n, nil
}

// ExportCAR streams did's repository as a CAR v1 to w: the current commit,
// then its MST nodes, then its records. With since (a rev), only blocks
// written after that rev follow the commit. It reads from one REPEATABLE
// READ snapshot and streams rows as they arrive, so memory stays constant
// whatever the repository's size.
func (e *Engine) ExportCAR(ctx context.Context, did syntax.DID, since string, w io.Writer) error {
	return pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qNoIdleLimit); err != nil {
			return fmt.Errorf("exporting: %w", db.Translate(err))
		}
		h, err := getHead(ctx, tx, did)
		if err != nil {
			return err
		}
		if err := car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{h.Commit}, Version: 1}, w); err != nil {
			return err
		}
		if err := util.LdWrite(w, h.Commit.Bytes(), h.CommitBytes); err != nil {
			return err
		}
		for _, q := range []string{qExportNodes, qExportRecords} {
			if err := streamBlocks(ctx, tx, q, did, since, w); err != nil {
				return err
			}
		}
		return nil
	})
}

func streamBlocks(ctx context.Context, tx pgx.Tx, q string, did syntax.DID, since string, w io.Writer) error {
	rows, err := tx.Query(ctx, q, did.String(), since)
	if err != nil {
		return fmt.Errorf("exporting blocks: %w", db.Translate(err))
	}
	var c, data []byte
	_, err = pgx.ForEachRow(rows, []any{&c, &data}, func() error {
		return util.LdWrite(w, c, data)
	})
	return err
}

// GetBlock returns one block of did's current repository (an MST node or a
// record) by CID.
func (e *Engine) GetBlock(ctx context.Context, did syntax.DID, c cid.Cid) ([]byte, error) {
	var data []byte
	err := db.Translate(e.pool.QueryRow(ctx, qGetBlockByCID, did.String(), c.Bytes()).Scan(&data))
	if errors.Is(err, db.ErrNotFound) {
		return nil, fmt.Errorf("%w: block %s", ErrRecordNotFound, c)
	}
	if err != nil {
		return nil, fmt.Errorf("reading block: %w", err)
	}
	return data, nil
}

// ProofCAR writes a CAR proving the record at collection/rkey (or its
// absence): the signed commit, every MST node on the path to the key, and
// the record block when it exists. It reads one node per tree level, from
// one snapshot.
func (e *Engine) ProofCAR(ctx context.Context, did syntax.DID, collection syntax.NSID, rkey syntax.RecordKey) ([]byte, error) {
	key := []byte(collection.String() + "/" + rkey.String())
	var out []byte
	err := pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		h, err := getHead(ctx, tx, did)
		if err != nil {
			return err
		}
		b := newCARBuilder(h.Commit)
		b.add(h.Commit, h.CommitBytes)
		next := &h.Data
		var found *cid.Cid
		for next != nil {
			var data []byte
			if err := tx.QueryRow(ctx, qGetNode, did.String(), next.Bytes()).Scan(&data); err != nil {
				return fmt.Errorf("%w: MST node %s: %v", ErrCorruptRepo, next, db.Translate(err))
			}
			b.add(*next, data)
			nd, err := mst.NodeDataFromCBOR(bytes.NewReader(data))
			if err != nil {
				return fmt.Errorf("%w: MST node %s: %v", ErrCorruptRepo, next, err)
			}
			next, found = descend(nd, key)
		}
		if found != nil {
			var data []byte
			err := tx.QueryRow(ctx, qGetRecord, did.String(), collection.String(), rkey.String()).Scan(new([]byte), &data)
			if err != nil {
				return fmt.Errorf("%w: record block %s: %v", ErrCorruptRepo, found, db.Translate(err))
			}
			b.add(*found, data)
		}
		out = b.bytes()
		return nil
	})
	return out, err
}

// descend finds key in one MST node: it returns the value's CID when the
// node holds the key, otherwise the child subtree that would hold it (nil
// when there is none: the key is absent).
func descend(nd *mst.NodeData, key []byte) (child, value *cid.Cid) {
	var prev []byte
	child = nd.Left
	for _, e := range nd.Entries {
		k := append(append([]byte{}, prev[:e.PrefixLen]...), e.KeySuffix...)
		prev = k
		switch c := bytes.Compare(key, k); {
		case c == 0:
			v := e.Value
			return nil, &v
		case c < 0:
			return child, nil
		}
		child = e.Right
	}
	return child, nil
}
