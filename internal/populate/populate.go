// Package populate fills a Bulwark database with many accounts at once: the
// database of a server at hosting scale, for measuring it (bulwark-load
// populate) and for tests that need Postgres to plan as it would at that
// scale (db/plantest).
//
// Each account is what createAccount and a life of writes would have left:
// a did:plc whose genesis operation is in the development PLC directory
// (dev_plc_operations), a K-256 signing key sealed as package account seals
// it, the shared password's argon2id hash, a signed repository (its
// records, every MST node and a commit signed with the account's key, built
// with indigo's MST as the engine builds it), blob references into a pool of
// stored images, sessions, and in proportion app passwords, preferences,
// OAuth grants and mail. Rows go in with COPY, many accounts per
// transaction; a batch's bookkeeping row commits with it, so a run stopped
// at any point, kill -9 included, continues where it stopped.
//
// Firehose history is made afterwards by History, through the repository
// engine's own write path.
package populate

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/account"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/plc"
)

//go:embed queries.sql
var queriesSQL string

var (
	queries           = db.MustParseQueries(queriesSQL)
	qCreateBatches    = queries.MustGet("CreateBatches")
	qCreateSettings   = queries.MustGet("CreateSettings")
	qInsertSettings   = queries.MustGet("InsertSettings")
	qGetSettings      = queries.MustGet("GetSettings")
	qDoneBatches      = queries.MustGet("DoneBatches")
	qInsertBatch      = queries.MustGet("InsertBatch")
	qBatchTotals      = queries.MustGet("BatchTotals")
	qAddHistory       = queries.MustGet("AddHistory")
	qAccountOfIndex   = queries.MustGet("AccountOfIndex")
	qAsyncCommit      = queries.MustGet("AsyncCommit")
	errSettingsDiffer = errors.New("populate: the database was populated with other settings")
)

// Config says what to populate. Pool, Keys, PLC, PublicURL, HandleDomain
// and Password are required.
type Config struct {
	Pool *pgxpool.Pool
	// Keys seals the signing keys (the server's key store: its secret is
	// derived from the PLC rotation key).
	Keys *account.KeyStore
	// PLC signs the genesis operations with the server's rotation key.
	PLC *plc.Client
	// PublicURL is the PDS endpoint the DID documents name.
	PublicURL string
	// HandleDomain is the handles' suffix, like ".test": account i is
	// u<i><HandleDomain>.
	HandleDomain string
	// Password is every account's password.
	Password string
	// Accounts is how many accounts the database holds when Run returns
	// (those of earlier runs included).
	Accounts int
	// Realistic is how many accounts (the first) follow the realistic size
	// distribution; the others are small (see ShapeOf). Default (0): all.
	// Runs growing one database must all give the same.
	Realistic int
	// Largest is account 0's number of records (0: from the distribution).
	Largest int
	// Seed makes the shapes (sizes, texts, times) reproducible.
	Seed uint64
	// Blobs is the pool records refer to (none: no blob references).
	Blobs []Blob
	// Workers build accounts in parallel (default GOMAXPROCS); Writers copy
	// batches into Postgres in parallel (default 2).
	Workers, Writers int
	// BatchRecords ends a batch once its accounts hold this many records
	// (default 20,000); a batch also ends at 2,000 accounts.
	BatchRecords int
	// Logger gets progress every LogEvery (default 10 s).
	Logger   *slog.Logger
	LogEvery time.Duration
}

// Handle is account i's handle.
func (c *Config) Handle(i int) string { return fmt.Sprintf("u%d%s", i, c.HandleDomain) }

// Email is account i's email address.
func (c *Config) Email(i int) string { return fmt.Sprintf("u%d@example.com", i) }

const maxBatchAccounts = 2000

func (c *Config) defaults() error {
	if c.Pool == nil || c.Keys == nil || c.PLC == nil || c.PublicURL == "" || c.HandleDomain == "" || c.Password == "" {
		return errors.New("populate: Pool, Keys, PLC, PublicURL, HandleDomain and Password are required")
	}
	if c.Realistic <= 0 {
		c.Realistic = math.MaxInt32
	}
	if c.Workers <= 0 {
		c.Workers = runtime.GOMAXPROCS(0)
	}
	if c.Writers <= 0 {
		c.Writers = 2
	}
	if c.BatchRecords <= 0 {
		c.BatchRecords = 20_000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.LogEvery <= 0 {
		c.LogEvery = 10 * time.Second
	}
	return nil
}

// Result sums up a run.
type Result struct {
	// Accounts and Records are what this run added; TotalAccounts and
	// TotalRecords what the database holds from all runs.
	Accounts, TotalAccounts int
	Records, TotalRecords   int64
	Elapsed                 time.Duration
}

// batch is a run of consecutive account indexes built and stored together.
type batch struct {
	shapes []Shape
	rows   rows
	count  int // records
}

// Run populates cfg.Pool up to cfg.Accounts accounts, skipping those
// earlier runs stored.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := prepare(ctx, &cfg); err != nil {
		return nil, err
	}
	hash, err := account.HashPassword(ctx, cfg.Password)
	if err != nil {
		return nil, err
	}
	todo, err := plan(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	b := &builder{cfg: &cfg, passwordHash: hash, now: time.Now().UTC()}
	start := time.Now()
	var accounts, records atomic.Int64

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan *batch)
	built := make(chan *batch, cfg.Writers)
	var errOnce sync.Once
	var firstErr error
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	go func() {
		defer close(jobs)
		for _, bt := range todo {
			select {
			case jobs <- bt:
			case <-ctx.Done():
				return
			}
		}
	}()
	var workers sync.WaitGroup
	for range cfg.Workers {
		workers.Go(func() {
			for bt := range jobs {
				if err := b.buildBatch(ctx, bt); err != nil {
					fail(err)
					return
				}
				select {
				case built <- bt:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() { workers.Wait(); close(built) }()
	var writers sync.WaitGroup
	for range cfg.Writers {
		writers.Go(func() {
			for bt := range built {
				if err := store(ctx, cfg.Pool, bt); err != nil {
					fail(err)
					return
				}
				accounts.Add(int64(len(bt.shapes)))
				records.Add(int64(bt.count))
			}
		})
	}
	stop := logProgress(&cfg, start, &accounts, &records)
	writers.Wait()
	stop()
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := &Result{Accounts: int(accounts.Load()), Records: records.Load(), Elapsed: time.Since(start)}
	var total int64
	if err := cfg.Pool.QueryRow(ctx, qBatchTotals).Scan(&total, &res.TotalRecords); err != nil {
		return nil, db.Translate(err)
	}
	res.TotalAccounts = int(total)
	return res, nil
}

// logProgress logs the accounts and records stored every cfg.LogEvery
// until the returned function is called.
func logProgress(cfg *Config, start time.Time, accounts, records *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(cfg.LogEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				el := time.Since(start)
				cfg.Logger.Info("populating", "accounts", accounts.Load(), "records", records.Load(),
					"accounts_per_s", int(float64(accounts.Load())/el.Seconds()),
					"records_per_s", int(float64(records.Load())/el.Seconds()), "elapsed", el.Round(time.Second))
			}
		}
	}()
	return func() { close(done) }
}

// prepare creates the bookkeeping tables and checks that an earlier run
// used the same shape settings.
func prepare(ctx context.Context, cfg *Config) error {
	for _, q := range []string{qCreateBatches, qCreateSettings} {
		if _, err := cfg.Pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("populate: %w", db.Translate(err))
		}
	}
	if _, err := cfg.Pool.Exec(ctx, qInsertSettings, int64(cfg.Seed), cfg.Realistic, cfg.Largest, cfg.HandleDomain, cfg.PublicURL); err != nil {
		return fmt.Errorf("populate: %w", db.Translate(err))
	}
	var seed int64
	var realistic, largest int
	var handles, publicURL string
	var history int64
	if err := cfg.Pool.QueryRow(ctx, qGetSettings).Scan(&seed, &realistic, &largest, &handles, &publicURL, &history); err != nil {
		return fmt.Errorf("populate: %w", db.Translate(err))
	}
	if uint64(seed) != cfg.Seed || realistic != cfg.Realistic || largest != cfg.Largest || handles != cfg.HandleDomain || publicURL != cfg.PublicURL {
		return fmt.Errorf("%w: seed %d, realistic %d, largest %d, handles %s, public URL %s",
			errSettingsDiffer, seed, realistic, largest, handles, publicURL)
	}
	return nil
}

// plan cuts the accounts no earlier run stored into batches.
func plan(ctx context.Context, cfg *Config) ([]*batch, error) {
	rows, err := cfg.Pool.Query(ctx, qDoneBatches)
	if err != nil {
		return nil, db.Translate(err)
	}
	done := make([]bool, cfg.Accounts)
	var first, count int
	_, err = pgx.ForEachRow(rows, []any{&first, &count}, func() error {
		for i := first; i < first+count && i < cfg.Accounts; i++ {
			done[i] = true
		}
		return nil
	})
	if err != nil {
		return nil, db.Translate(err)
	}
	var out []*batch
	var cur *batch
	for i := range cfg.Accounts {
		if done[i] {
			cur = nil
			continue
		}
		s := ShapeOf(cfg, i)
		if cur == nil || cur.count+s.Records > cfg.BatchRecords || len(cur.shapes) >= maxBatchAccounts {
			cur = &batch{}
			out = append(out, cur)
		}
		cur.shapes = append(cur.shapes, s)
		cur.count += s.Records + 1
	}
	return out, nil
}

// buildBatch builds bt's accounts.
func (b *builder) buildBatch(ctx context.Context, bt *batch) error {
	bt.rows = rows{}
	bt.count = 0
	for _, s := range bt.shapes {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := b.build(ctx, s, bt.rows)
		if err != nil {
			return fmt.Errorf("populate: account %d: %w", s.Index, err)
		}
		bt.count += n
	}
	return nil
}
