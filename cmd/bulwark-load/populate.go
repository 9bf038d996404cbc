package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/internal/populate"
	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/serverid"
)

// populateOptions are populate's own flags; the server's settings come
// from the same flags and BULWARK_* variables as bulwark serve's.
type populateOptions struct {
	accounts, realistic, largest int
	history, historyWriters      int
	seed                         uint64
	password                     string
	blobs                        int
	workers, writers, batch      int
	vacuum                       bool
}

const populateUsage = `bulwark-load populate fills a server's database with accounts, as a server at
hosting scale holds them, straight into Postgres (not over HTTP): did:plc
identities in the development PLC directory, signing keys, real signed
repositories with a realistic size distribution, blob references, sessions,
app passwords, preferences, OAuth grants and mail in proportion; then
--history commits through the repository engine, the firehose history a
relay backfills. The server must not be running; start it afterwards with
the same settings.

Stopped at any point (kill -9 included), it continues where it stopped when
run again; --accounts is the total the database holds at the end, so a run
with a larger number grows a populated database.

Usage:
  bulwark-load populate --data-dir ./big --hostname localhost:31901 \
      --handle-domains .test --accounts 100000 [--history 100000]

Flags (the server's settings also as BULWARK_*, populate's as BULWARK_LOAD_*):
`

func runPopulate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bulwark-load populate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config.DefaultConfig()
	cfg.RegisterFlags(fs)
	var o populateOptions
	fs.IntVar(&o.accounts, "accounts", 10_000, "accounts the database holds at the end (earlier runs' included)")
	fs.IntVar(&o.realistic, "realistic", 0, "how many accounts (the first) follow the realistic size distribution; the rest hold 3-20 records (0 = all)")
	fs.IntVar(&o.largest, "largest", populate.MaxRecords, "records of account 0, the largest (0 = from the distribution)")
	fs.IntVar(&o.history, "history", 0, "firehose history: commits the database holds made through the engine (earlier runs' included)")
	fs.IntVar(&o.historyWriters, "history-writers", 8, "concurrent writers making the history")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the shapes (sizes, texts, times): the same seed makes the same distribution")
	fs.StringVar(&o.password, "password", "populate-password", "every account's password")
	fs.IntVar(&o.blobs, "blobs", 256, "images in the pool the records refer to")
	fs.IntVar(&o.workers, "workers", 0, "goroutines building accounts (0 = one per core)")
	fs.IntVar(&o.writers, "writers", 2, "concurrent COPY transactions")
	fs.IntVar(&o.batch, "batch-records", 20_000, "records per transaction, about")
	fs.BoolVar(&o.vacuum, "vacuum", true, "VACUUM ANALYZE the database at the end, as autovacuum would have by the time a server is this size")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), populateUsage)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, "bulwark-load populate", args, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 || o.accounts < 1 || o.history < 0 {
		fmt.Fprintln(stderr, "bulwark-load populate: want --accounts >= 1, --history >= 0, no arguments")
		return 2
	}
	if err := cfg.Finalize(); err != nil {
		fmt.Fprintln(stderr, "bulwark-load populate:", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if err := populateServer(ctx, cfg, o, stdout, logger); err != nil {
		fmt.Fprintln(stderr, "bulwark-load populate:", err)
		return 1
	}
	return 0
}

// populateServer opens the server's database (starting its managed
// Postgres), migrates it and populates it.
func populateServer(ctx context.Context, cfg *config.Config, o populateOptions, stdout io.Writer, logger *slog.Logger) error {
	if !cfg.DevPLC {
		return errors.New("populate makes DIDs in the server's development PLC directory: use a local host name (like localhost:<port>) and no --plc-url")
	}
	if _, err := cfg.EnsureSecrets(); err != nil {
		return err
	}
	pool, closeDB, err := openServerDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := db.Migrate(ctx, pool, logger); err != nil {
		return err
	}
	if err := serverid.RecordHost(ctx, pool, serverid.Host{Hostname: cfg.Hostname, PublicURL: cfg.PublicURL()}); err != nil {
		return err
	}
	pc, err := populateConfig(ctx, cfg, o, pool, logger)
	if err != nil {
		return err
	}
	res, err := populate.Run(ctx, *pc)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "accounts: %d added in %s (%.0f/s), %d records (%.0f/s); the database holds %d accounts, %d records\n",
		res.Accounts, res.Elapsed.Round(time.Second), float64(res.Accounts)/res.Elapsed.Seconds(),
		res.Records, float64(res.Records)/res.Elapsed.Seconds(), res.TotalAccounts, res.TotalRecords)
	if err := populateHistory(ctx, *pc, o, pool, stdout); err != nil {
		return err
	}
	if o.vacuum {
		start := time.Now()
		if _, err := pool.Exec(ctx, qVacuumAnalyze); err != nil {
			return fmt.Errorf("vacuum: %w", db.Translate(err))
		}
		fmt.Fprintf(stdout, "vacuum analyze: %s\n", time.Since(start).Round(time.Second))
	}
	return printSizes(ctx, pool, stdout)
}

// populateConfig is the populate.Config of cfg's server and o.
func populateConfig(ctx context.Context, cfg *config.Config, o populateOptions, pool *pgxpool.Pool, logger *slog.Logger) (*populate.Config, error) {
	rotation, err := cfg.PLCRotationPrivateKey()
	if err != nil {
		return nil, err
	}
	keys, err := account.NewKeyStore(pool, rotation.Bytes())
	if err != nil {
		return nil, err
	}
	pc, err := plc.NewClient(cfg.PLCURL, rotation, nil)
	if err != nil {
		return nil, err
	}
	var store blob.Store
	if cfg.BlobS3Bucket == "" {
		if store, err = blob.NewDiskStore(cfg.BlobDir); err != nil {
			return nil, err
		}
	}
	blobs, err := populate.MakeBlobs(ctx, o.seed, o.blobs, store)
	if err != nil {
		return nil, err
	}
	return &populate.Config{
		Pool: pool, Keys: keys, PLC: pc, PublicURL: cfg.PublicURL(), HandleDomain: cfg.HandleDomains[0],
		Password: o.password, Accounts: o.accounts, Realistic: o.realistic, Largest: o.largest, Seed: o.seed,
		Blobs: blobs, Workers: o.workers, Writers: o.writers, BatchRecords: o.batch, Logger: logger,
	}, nil
}

// populateHistory makes the history commits the database does not hold yet.
func populateHistory(ctx context.Context, pc populate.Config, o populateOptions, pool *pgxpool.Pool, stdout io.Writer) error {
	var have int64
	if err := pool.QueryRow(ctx, qPopulatedHistory).Scan(&have); err != nil {
		return db.Translate(err)
	}
	want := int64(o.history) - have
	if want <= 0 {
		return nil
	}
	start := time.Now()
	n, err := populate.History(ctx, pc, int(want), o.historyWriters)
	if err != nil {
		return err
	}
	el := time.Since(start)
	fmt.Fprintf(stdout, "history: %d commits in %s (%.0f/s)\n", n, el.Round(time.Second), float64(n)/el.Seconds())
	return nil
}

// printSizes prints the database's size and its largest tables'.
func printSizes(ctx context.Context, pool *pgxpool.Pool, w io.Writer) error {
	rows, err := pool.Query(ctx, qTableSizes)
	if err != nil {
		return db.Translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var total, heap, toast, index, n int64
		if err := rows.Scan(&name, &total, &heap, &toast, &index, &n); err != nil {
			return db.Translate(err)
		}
		fmt.Fprintf(w, "  %-22s %9.1f MiB (heap %.1f, toast %.1f, indexes %.1f), ~%d rows\n", name,
			mib(total), mib(heap), mib(toast), mib(index), n)
	}
	return db.Translate(rows.Err())
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// openServerDatabase opens the database cfg's server uses: cfg's URL, or
// the managed cluster under the data dir (started here, stopped by the
// returned function), as bulwark serve does.
func openServerDatabase(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*pgxpool.Pool, func(), error) {
	url := cfg.DatabaseURL
	var m *db.Managed
	if url == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
			return nil, nil, err
		}
		var err error
		m, err = db.StartManaged(ctx, db.ManagedConfig{Dir: filepath.Join(cfg.DataDir, "postgres"), Logger: logger, Settings: cfg.PostgresSettings})
		if err != nil {
			return nil, nil, fmt.Errorf("managed postgres: %w", err)
		}
		url = m.URL(db.ManagedDatabase)
	}
	stop := func() {
		if m != nil {
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = m.Stop(sctx)
		}
	}
	pool, err := db.Open(ctx, url, logger)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); stop() }, nil
}
