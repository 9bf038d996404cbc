package populate_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/db/dbtest"
	"github.com/bulwark-pds/bulwark/internal/populate"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
	"github.com/bulwark-pds/bulwark/repo"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const publicURL = "http://localhost:31999"

func config(t *testing.T, pool *pgxpool.Pool, accounts int) populate.Config {
	t.Helper()
	rotation, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	keys, err := account.NewKeyStore(pool, rotation.Bytes())
	require.NoError(t, err)
	pc, err := plc.NewClient(publicURL, rotation, nil)
	require.NoError(t, err)
	blobs, err := populate.MakeBlobs(context.Background(), 7, 8, nil)
	require.NoError(t, err)
	return populate.Config{
		Pool: pool, Keys: keys, PLC: pc, PublicURL: publicURL, HandleDomain: ".test", Password: "populate-password",
		Accounts: accounts, Largest: 600, Seed: 7, Blobs: blobs, BatchRecords: 300, Workers: 2,
	}
}

// Every populated repository is a valid signed repository of its DID: its
// CAR loads with indigo, the commit verifies against the signing key in the
// DID's genesis operation in the development PLC directory, and its
// records are those of the records table.
func TestRepositoriesVerify(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.New(t)
	cfg := config(t, pool, 12)
	res, err := populate.Run(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, 12, res.TotalAccounts)
	require.Greater(t, res.TotalRecords, int64(600))

	engine := repo.New(pool, cfg.Keys, nil, repo.Config{})
	dir := plctest.NewPostgresStore(pool)
	for i := range 12 {
		var did string
		require.NoError(t, pool.QueryRow(ctx, "SELECT did FROM accounts WHERE handle = $1", cfg.Handle(i)).Scan(&did))
		log, err := dir.Log(ctx, did)
		require.NoError(t, err)
		require.NoError(t, didplc.VerifyOpLog(log))
		require.NotNil(t, log[0].Operation.Regular)
		doc, err := log[0].Operation.Regular.Doc(did)
		require.NoError(t, err)
		key, err := atcrypto.ParsePublicMultibase(doc.VerificationMethod[0].PublicKeyMultibase)
		require.NoError(t, err)

		var car bytes.Buffer
		require.NoError(t, engine.ExportCAR(ctx, syntax.DID(did), "", &car))
		commit, r, err := atrepo.LoadRepoFromCAR(ctx, &car)
		require.NoError(t, err, "account %d", i)
		require.NoError(t, commit.VerifySignature(key), "account %d", i)
		var n int
		require.NoError(t, r.MST.Walk(func([]byte, cid.Cid) error { n++; return nil }))
		var stored int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM records WHERE did = $1", did).Scan(&stored))
		require.Equal(t, stored, n, "account %d: MST entries against stored records", i)
		if i == 0 {
			require.Equal(t, 601, n, "account 0 holds Largest records and its profile")
		}
	}
}

// A batch is stored whole or not at all, and a later run stores what is
// missing and nothing twice: here the batch holding account 7 fails (its
// handle is taken), the others are stored, and once the handle is free
// again the next run completes the database.
func TestResumesAfterAFailedBatch(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.New(t)
	cfg := config(t, pool, 12)
	cfg.Largest = 0
	cfg.BatchRecords = 40
	cfg.Writers = 1
	_, err := pool.Exec(ctx, `INSERT INTO accounts (did, handle, password_hash, signing_key) VALUES ('did:plc:squatter', $1, 'x', '\x00')`, cfg.Handle(7))
	require.NoError(t, err)
	_, err = populate.Run(ctx, cfg)
	require.ErrorContains(t, err, "accounts")

	stored := func() map[string]int {
		rows, err := pool.Query(ctx, "SELECT handle, count(*) FROM accounts GROUP BY handle")
		require.NoError(t, err)
		out := map[string]int{}
		for rows.Next() {
			var h string
			var n int
			require.NoError(t, rows.Scan(&h, &n))
			out[h] = n
		}
		require.NoError(t, rows.Err())
		return out
	}
	var failedCount int
	got := stored()
	// The batch of account 7 left no account behind, nor any repository.
	for i := range 12 {
		if i != 7 && got[cfg.Handle(i)] == 0 {
			failedCount++
		}
	}
	// What is stored is exactly what the recorded batches cover: no batch
	// was stored in part.
	var covered int
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM populate_batches`).Scan(&covered))
	require.Equal(t, 11-failedCount, covered)
	var orphans int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM repo_roots r WHERE NOT EXISTS (SELECT 1 FROM accounts a WHERE a.did = r.did)`).Scan(&orphans))
	require.Zero(t, orphans)

	_, err = pool.Exec(ctx, `DELETE FROM accounts WHERE did = 'did:plc:squatter'`)
	require.NoError(t, err)
	res, err := populate.Run(ctx, cfg)
	require.NoError(t, err)
	require.Equal(t, 12, res.TotalAccounts)
	require.Equal(t, failedCount+1, res.Accounts, "the second run stored the failed batch only")
	got = stored()
	require.Len(t, got, 12)
	for i := range 12 {
		require.Equal(t, 1, got[cfg.Handle(i)], "account %d", i)
	}
}

// History commits go through the engine onto the populated trees (which it
// must load and accept), each appending a #commit event that ends up
// sequenced.
func TestHistory(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.New(t)
	cfg := config(t, pool, 5)
	cfg.Largest = 0
	_, err := populate.Run(ctx, cfg)
	require.NoError(t, err)
	n, err := populate.History(ctx, cfg, 30, 3)
	require.NoError(t, err)
	require.EqualValues(t, 30, n)
	var commits, unsequenced, history int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'commit'), count(*) FILTER (WHERE seq IS NULL),
		(SELECT history FROM populate_settings) FROM events`).Scan(&commits, &unsequenced, &history))
	require.Equal(t, 30, commits)
	require.Zero(t, unsequenced)
	require.Equal(t, 30, history)
}
