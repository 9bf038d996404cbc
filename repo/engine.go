package repo

import (
	"context"
	_ "embed"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/metrics"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qLockRoot        = queries.MustGet("LockRoot")
	qHoldLockBriefly = queries.MustGet("HoldLockBriefly")
	qNoIdleLimit     = queries.MustGet("NoIdleLimit")
	qInsertRoot      = queries.MustGet("InsertRoot")
	qGetHead         = queries.MustGet("GetHead")
	qLoadNodes       = queries.MustGet("LoadNodes")
	qGetNode         = queries.MustGet("GetNode")
	qInsertNodes     = queries.MustGet("InsertNodes")
	qGetRecord       = queries.MustGet("GetRecord")
	qListCollections = queries.MustGet("ListCollections")
	qExportNodes     = queries.MustGet("ExportNodes")
	qExportRecords   = queries.MustGet("ExportRecords")
	qGetBlockByCID   = queries.MustGet("GetBlockByCID")
	qCountRecords    = queries.MustGet("CountRecords")
	qCommit          = queries.MustGet("Commit")
	qTryCommit       = queries.MustGet("TryCommit")
	qRepoSince       = queries.MustGet("RepoSince")
	qRepoNodesSince  = queries.MustGet("RepoNodesSince")
	qDeleteRepo      = []string{queries.MustGet("DeleteRepoRecords"), queries.MustGet("DeleteRepoNodes"), queries.MustGet("DeleteRepoRoot")}
)

// KeySource gives the engine an account's repository signing key.
type KeySource interface {
	SigningKey(ctx context.Context, did syntax.DID) (atcrypto.PrivateKey, error)
}

// Waker is told when a commit has been stored (the firehose sequencer).
type Waker interface {
	Wake()
}

// RecordBlobs lists the blobs one record references after a commit (none
// for a deleted record).
type RecordBlobs struct {
	Collection syntax.NSID
	RKey       syntax.RecordKey
	Blobs      []atdata.Blob
	// Created is true when the path held no record before this commit, so
	// it had no references to release.
	Created bool
}

// BlobTracker keeps blob references in step with records. It is called
// inside the commit's transaction, after the records are written, with every
// record the commit touched; an error (for example a reference to a blob the
// account never uploaded) aborts the whole commit.
type BlobTracker interface {
	TrackTx(ctx context.Context, tx db.DBTX, did syntax.DID, rev string, changes []RecordBlobs) error
}

// Config tunes the engine. The zero value works.
type Config struct {
	// Blobs, when set, is told which blobs each commit's records reference.
	Blobs BlobTracker
	// CacheBytes bounds the MST node bytes kept in memory across repos
	// (default 64 MiB). Decoded trees take a few times more.
	CacheBytes int64
	// Logger receives the engine's logs (default slog.Default()).
	Logger *slog.Logger
	// ClockID is the TID clock id of this process (0-1023) in the record
	// keys and revs it makes: processes writing to one database must each
	// have their own (cluster.Node claims one), or two of them may pick
	// the same key for records created at the same microsecond.
	ClockID uint
	// Sessions, when set, is a pool of direct connections to Postgres for
	// the work that needs one session across transactions (an import's
	// staging tables), when the main pool goes through a transaction-mode
	// pooler. Default: the main pool.
	Sessions *pgxpool.Pool

	// groupLeaders is how many commit groups may be in flight at once
	// (group.go); 0 means the default, negative turns grouping off.
	groupLeaders int
	// counters are the Prometheus counters the engine records in (nil:
	// the server's, package metrics); tests give each engine its own.
	counters *counters
}

// counters are what the engine counts beside commits (which the XRPC layer
// counts): commits built on a cached tree whose root another process had
// moved, and group commit's groups, their commits, and the groups refused
// whole and stored commit by commit.
type counters struct {
	staleRoots, refreshes, commitGroups, groupedCommits, groupRetries, plans, checks prometheus.Counter
	// hints counts other nodes' hints by what became of them (hints.go).
	hints *prometheus.CounterVec
}

// serverCounters are the process's metrics.
var serverCounters = &counters{
	staleRoots:     metrics.StaleRoots,
	refreshes:      metrics.StateRefreshes,
	commitGroups:   metrics.CommitGroups,
	groupedCommits: metrics.GroupedCommits,
	groupRetries:   metrics.CommitGroupRetries,
	plans:          metrics.CommitPlans,
	checks:         metrics.RootChecks,
	hints:          metrics.RepoHints,
}

// Engine reads and writes repositories.
type Engine struct {
	// fastCommits counts the commits the one-round-trip path stored.
	fastCommits atomic.Int64
	// nodeWalks counts the refreshes that the records written since could
	// not do, which read the MST nodes written since (refresh.go).
	nodeWalks atomic.Int64
	counters  *counters
	group     groupCommitter
	// active counts commits in flight (from the writer's turn to its
	// answer): a lone commit is sent at once, concurrent ones in groups.
	active atomic.Int64

	// writers queues this process's Apply calls per repo, first come first
	// served: one at a time, each finds the tree its predecessor left in
	// the cache and commits in one round trip, instead of all of them
	// waiting on the repo's row lock and loading the tree from the
	// database. A waiter holds no database connection.
	writersMu sync.Mutex
	writers   map[string]*writerQueue

	blobs    BlobTracker
	pool     *pgxpool.Pool
	sessions *pgxpool.Pool
	keys     KeySource
	waker    Waker
	cache    *treeCache
	clock    atomic.Pointer[syntax.TIDClock]
	log      *slog.Logger

	// hintSender sends hints of this process's commits to the other
	// nodes, and hints keeps theirs (hints.go).
	hintSender atomic.Pointer[HintSender]
	hints      hintBook
}

// New returns an engine over pool. waker may be nil.
func New(pool *pgxpool.Pool, keys KeySource, waker Waker, cfg Config) *Engine {
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.groupLeaders == 0 {
		cfg.groupLeaders = defaultGroupLeaders
	}
	if cfg.counters == nil {
		cfg.counters = serverCounters
	}
	if cfg.Sessions == nil {
		cfg.Sessions = pool
	}
	e := &Engine{
		counters: cfg.counters,
		writers:  map[string]*writerQueue{},
		group:    groupCommitter{maxLeaders: cfg.groupLeaders},
		blobs:    cfg.Blobs,
		pool:     pool,
		sessions: cfg.Sessions,
		keys:     keys,
		waker:    waker,
		cache:    newTreeCache(cfg.CacheBytes),
		log:      cfg.Logger.With("component", "repo"),
	}
	e.SetClockID(cfg.ClockID)
	return e
}

// SetClockID makes the engine's record keys and revs carry clock id id
// from now on (cluster.Node reports a new one after a long partition).
func (e *Engine) SetClockID(id uint) {
	e.clock.Store(syntax.NewTIDClock(id))
}

// nextRev returns a TID above both the clock and the previous rev, so revs
// increase per repo even if the wall clock steps back or another process
// wrote last.
func (e *Engine) nextRev(prev string) string {
	rev := e.clock.Load().Next()
	if prev != "" && rev.String() <= prev {
		if t, err := syntax.ParseTID(prev); err == nil {
			c := syntax.ClockFromTID(t)
			rev = c.Next()
		}
	}
	return rev.String()
}
