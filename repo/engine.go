package repo

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/atdata"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/multiformats/go-multihash"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/fastsyntax"
	"github.com/bulwark-pds/bulwark/limits"
	"github.com/bulwark-pds/bulwark/metrics"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qLockRoot        = queries.MustGet("LockRoot")
	qInsertRoot      = queries.MustGet("InsertRoot")
	qGetHead         = queries.MustGet("GetHead")
	qLoadNodes       = queries.MustGet("LoadNodes")
	qGetNode         = queries.MustGet("GetNode")
	qInsertNodes     = queries.MustGet("InsertNodes")
	qGetRecord       = queries.MustGet("GetRecord")
	qListRecordsAsc  = queries.MustGet("ListRecordsAsc")
	qListRecordsDesc = queries.MustGet("ListRecordsDesc")
	qListCollections = queries.MustGet("ListCollections")
	qExportNodes     = queries.MustGet("ExportNodes")
	qExportRecords   = queries.MustGet("ExportRecords")
	qGetBlockByCID   = queries.MustGet("GetBlockByCID")
	qCountRecords    = queries.MustGet("CountRecords")
	qCommit          = queries.MustGet("Commit")
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
	Logger     *slog.Logger

	// groupLeaders is how many commit groups may be in flight at once
	// (group.go); 0 means the default, negative turns grouping off.
	groupLeaders int
}

// Engine reads and writes repositories.
type Engine struct {
	// Counters of the one-round-trip path: commits it stored, and attempts
	// the database refused because another writer had moved the root.
	fastCommits, staleRoots atomic.Int64
	// Group commit counters: commits stored in a group of several, and
	// groups refused whole and stored one by one.
	groupedCommits, splitGroups atomic.Int64
	group                       groupCommitter
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

	blobs BlobTracker
	pool  *pgxpool.Pool
	keys  KeySource
	waker Waker
	cache *treeCache
	clock *syntax.TIDClock
	log   *slog.Logger
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
	return &Engine{
		writers: map[string]*writerQueue{},
		group:   groupCommitter{maxLeaders: cfg.groupLeaders},
		blobs:   cfg.Blobs,
		pool:    pool,
		keys:    keys,
		waker:   waker,
		cache:   newTreeCache(cfg.CacheBytes),
		clock:   syntax.NewTIDClock(0),
		log:     cfg.Logger.With("component", "repo"),
	}
}

// Action is what a Write does.
type Action string

// The three write actions of com.atproto.repo.applyWrites.
const (
	ActionCreate Action = "create"
	ActionUpdate Action = "update"
	ActionDelete Action = "delete"
)

// Swap is a compare-and-swap condition on a record: the write applies only
// if the record's current CID is CID, or, with CID nil, only if there is no
// record at the path.
type Swap struct {
	CID *cid.Cid
}

// Write is one operation of a commit.
type Write struct {
	Action     Action
	Collection syntax.NSID
	// RKey may be empty on create: the engine assigns a TID.
	RKey syntax.RecordKey
	// Record is the record's data (create and update), as parsed by
	// atdata.UnmarshalJSON. Its $type must equal Collection.
	Record map[string]any
	// SwapRecord, when set, must match the record's current state.
	SwapRecord *Swap
}

// WriteResult reports one applied write.
type WriteResult struct {
	Action     Action
	Collection syntax.NSID
	RKey       syntax.RecordKey
	// CID is the new record's CID; undefined for deletes.
	CID cid.Cid
}

// CommitResult reports a stored commit.
type CommitResult struct {
	Commit  cid.Cid
	Rev     string
	Results []WriteResult
}

// Head is a repository's current commit.
type Head struct {
	Commit      cid.Cid
	CommitBytes []byte
	Data        cid.Cid
	Rev         string
}

var cidBuilder = cid.NewPrefixV1(cid.DagCBOR, multihash.SHA2_256)

// preparedWrite is a Write with its record encoded and its path fixed.
type preparedWrite struct {
	Write
	path  string
	cid   cid.Cid
	block []byte
}

// prepare encodes records and checks every limit that does not need the
// tree, before any lock is taken.
func (e *Engine) prepare(writes []Write) ([]preparedWrite, error) {
	if len(writes) < 1 || len(writes) > limits.MaxCommitOps {
		return nil, &LimitError{Limit: LimitCommitOps, Size: len(writes), Max: limits.MaxCommitOps}
	}
	out := make([]preparedWrite, len(writes))
	seen := make(map[string]bool, len(writes))
	for i, w := range writes {
		pw := preparedWrite{Write: w}
		switch w.Action {
		case ActionCreate:
			if pw.RKey == "" {
				pw.RKey = syntax.RecordKey(e.clock.Next().String())
			}
		case ActionUpdate, ActionDelete:
			if pw.RKey == "" {
				return nil, fmt.Errorf("%w: %s of %s needs an rkey", ErrInvalidWrite, w.Action, w.Collection)
			}
		default:
			return nil, fmt.Errorf("%w: unknown action %q", ErrInvalidWrite, w.Action)
		}
		if _, err := fastsyntax.ParseNSID(string(w.Collection)); err != nil {
			return nil, fmt.Errorf("%w: collection %q: %v", ErrInvalidWrite, w.Collection, err)
		}
		if _, err := fastsyntax.ParseRecordKey(string(pw.RKey)); err != nil {
			return nil, fmt.Errorf("%w: record key %q: %v", ErrInvalidWrite, pw.RKey, err)
		}
		pw.path = string(w.Collection) + "/" + string(pw.RKey)
		if !mst.IsValidKey([]byte(pw.path)) {
			return nil, fmt.Errorf("%w: %q is not a valid repository path", ErrInvalidWrite, pw.path)
		}
		if seen[pw.path] {
			return nil, fmt.Errorf("%w: %s is written twice in one commit", ErrInvalidWrite, pw.path)
		}
		seen[pw.path] = true
		if w.Action != ActionDelete {
			block, c, err := encodeRecord(pw.path, w.Collection, w.Record)
			if err != nil {
				return nil, err
			}
			pw.block, pw.cid = block, c
		}
		out[i] = pw
	}
	return out, nil
}

// encodeRecord checks a record's data and encodes it as a DAG-CBOR block,
// enforcing the per-record limits on the encoded bytes.
func encodeRecord(path string, collection syntax.NSID, rec map[string]any) ([]byte, cid.Cid, error) {
	if rec == nil {
		return nil, cid.Undef, fmt.Errorf("%w: %s has no record", ErrInvalidWrite, path)
	}
	typ, _ := rec["$type"].(string)
	if typ != string(collection) {
		return nil, cid.Undef, fmt.Errorf("%w: record $type %q does not match collection %q", ErrInvalidWrite, typ, collection)
	}
	block, err := atdata.MarshalCBOR(rec)
	if err != nil {
		return nil, cid.Undef, fmt.Errorf("%w: %s cannot be encoded as DAG-CBOR: %v", ErrInvalidWrite, path, err)
	}
	if len(block) <= limits.MaxRecordCBORBytes {
		// Check the data model on the bytes that will be stored (no floats,
		// valid blob and link shapes, depth and size bounds), whatever the
		// caller built the map from.
		if _, err := atdata.UnmarshalCBOR(block); err != nil {
			return nil, cid.Undef, fmt.Errorf("%w: %s is not valid atproto data: %v", ErrInvalidWrite, path, err)
		}
	}
	if len(block) > limits.MaxRecordCBORBytes {
		return nil, cid.Undef, &LimitError{Limit: LimitRecordCBOR, Path: path, Size: len(block), Max: limits.MaxRecordCBORBytes}
	}
	if len(block) > limits.MaxRecordBlockBytes {
		return nil, cid.Undef, &LimitError{Limit: LimitRecordBlock, Path: path, Size: len(block), Max: limits.MaxRecordBlockBytes}
	}
	c, err := cidBuilder.Sum(block)
	if err != nil {
		return nil, cid.Undef, err
	}
	return block, c, nil
}

// Apply commits writes to did's repository as one signed commit and appends
// its #commit event, in one transaction. swapCommit, when set, must be the
// current commit. Nothing is stored if any check fails. A commit whose writes
// change nothing (updates to identical records) is not stored; the current
// head is returned.
func (e *Engine) Apply(ctx context.Context, did syntax.DID, writes []Write, swapCommit *cid.Cid) (*CommitResult, error) {
	return e.ApplyGuarded(ctx, did, writes, swapCommit, nil)
}

// Guard is a statement run first in a commit's transaction, before the
// repo is locked or anything is written; if it fails (raises), nothing is
// stored and Apply returns its error. The XRPC layer uses one to check the
// writer's session and account status in the commit's own transaction
// instead of in a round trip of its own.
type Guard struct {
	SQL  string
	Args []any
}

// ApplyGuarded is Apply with a guard statement (nil for none).
func (e *Engine) ApplyGuarded(ctx context.Context, did syntax.DID, writes []Write, swapCommit *cid.Cid, guard *Guard) (*CommitResult, error) {
	prepared, err := e.prepare(writes)
	if err != nil {
		return nil, err
	}
	key, err := e.keys.SigningKey(ctx, did)
	if err != nil {
		return nil, err
	}
	leave, err := e.enter(ctx, did.String())
	if err != nil {
		return nil, err
	}
	defer leave()
	active := e.active.Add(1)
	defer e.active.Add(-1)
	lc := &lazyConn{pool: e.pool}
	defer lc.release()
	res, newState, done, err := e.applyOptimistic(ctx, lc, did, key, prepared, swapCommit, guard, active)
	if err != nil {
		return nil, err
	}
	if !done {
		conn, err := lc.get(ctx)
		if err != nil {
			return nil, fmt.Errorf("acquiring a connection: %w", db.Translate(err))
		}
		res, newState, err = e.applyTx(ctx, conn, did, key, prepared, swapCommit, guard)
		if err != nil {
			rollback(ctx, conn)
			return nil, err
		}
	}
	if newState != nil {
		e.cache.put(newState)
		if e.waker != nil {
			e.waker.Wake()
		}
	}
	return res, nil
}

// writerQueue admits one of this process's writers of a repo at a time.
type writerQueue struct {
	turn    chan struct{} // holds a token while a writer is in
	waiting int           // writers in or waiting; guarded by writersMu
}

// enter waits for did's turn among this process's writers (first come,
// first served) and returns the function that ends it.
func (e *Engine) enter(ctx context.Context, did string) (func(), error) {
	e.writersMu.Lock()
	q := e.writers[did]
	if q == nil {
		q = &writerQueue{turn: make(chan struct{}, 1)}
		e.writers[did] = q
	}
	q.waiting++
	e.writersMu.Unlock()
	done := func() {
		e.writersMu.Lock()
		if q.waiting--; q.waiting == 0 {
			delete(e.writers, did)
		}
		e.writersMu.Unlock()
	}
	select {
	case q.turn <- struct{}{}:
		return func() { <-q.turn; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}

// errRootMoved is the SQLSTATE bulwark_swap_root raises when a repo's
// commit is not the one a writer built on (migrations/00007).
const errRootMoved = "BW001"

// applyOptimistic commits in one round trip when this process holds the
// repo's tree in its cache (the writer's turn, see enter, guarantees no
// other writer of this process has it out): the commit is built from the cached state and
// sent as one pipelined batch with no BEGIN or COMMIT (the statements of a
// pipeline up to its Sync run as one implicit transaction, committed at the
// Sync, or rolled back whole if any statement fails). The batch's first
// statement, bulwark_swap_root, takes the repo row lock and moves the root
// from the cached commit to the new one, or raises when the stored commit
// is not the cached one, which aborts the batch before any other write.
// done is false when the fast path does not apply or the root moved
// (another process wrote); the caller then takes the two-round-trip path,
// which reads the root inside the lock. Commits whose records touch blob
// references take that path too, since the blob tracker needs the
// transaction open. While other commits are in flight, the batch joins a
// group of them (group.go).
func (e *Engine) applyOptimistic(ctx context.Context, lc *lazyConn, did syntax.DID, key atcrypto.PrivateKey, writes []preparedWrite, swapCommit *cid.Cid, guard *Guard, active int64) (*CommitResult, *repoState, bool, error) {
	if e.blobs != nil {
		for _, w := range writes {
			if w.Action != ActionCreate || len(atdata.ExtractBlobs(w.Record)) > 0 {
				return nil, nil, false, nil
			}
		}
	}
	st := e.cache.takeAny(did.String())
	if st == nil || !st.commit.Defined() {
		return nil, nil, false, nil
	}
	if swapCommit != nil && !swapCommit.Equals(st.commit) {
		// The two-round-trip path reports the swap against the database.
		return nil, nil, false, nil
	}
	built := st.commit
	p, err := e.plan(ctx, st, did, key, writes)
	if err != nil || p.rows == nil {
		// The cached state may be stale: let the locked path decide.
		return nil, nil, false, nil
	}
	p.rows.freshNodes = true
	if e.useGroup(active) {
		err = e.storeGrouped(ctx, lc, guard, p.rows, built.Bytes())
	} else if conn, cerr := lc.get(ctx); cerr != nil {
		err = cerr
	} else {
		err = e.storeOne(ctx, conn, guard, p.rows, built.Bytes())
	}
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == errRootMoved || errors.Is(db.Translate(err), db.ErrConflict) {
			// Another process moved the root, or (unique violation) a node
			// the cache did not know of is stored: the locked path redoes
			// the commit from the database.
			e.staleRoots.Add(1)
			metrics.StaleRoots.Inc()
			return nil, nil, false, nil
		}
		return nil, nil, true, fmt.Errorf("storing commit: %w", db.Translate(err))
	}
	p.finish()
	e.fastCommits.Add(1)
	return p.res, st, true, nil
}

// rollback ends a commit transaction that failed part-way. A connection
// that cannot even roll back is closed, so the pool never hands out one in
// the middle of a transaction.
func rollback(ctx context.Context, conn *pgxpool.Conn) {
	ctx = context.WithoutCancel(ctx)
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}

// applyTx runs one commit on conn in two round trips: BEGIN with the row
// lock and the root read, then every write with COMMIT at the end (plus the
// blob tracker's statements, when a record references blobs). On an error
// the caller rolls back.
func (e *Engine) applyTx(ctx context.Context, conn *pgxpool.Conn, did syntax.DID, key atcrypto.PrivateKey, writes []preparedWrite, swapCommit *cid.Cid, guard *Guard) (*CommitResult, *repoState, error) {
	var commitRaw, dataRaw []byte
	var oldRev string
	begin := &pgx.Batch{}
	begin.Queue("BEGIN")
	if guard != nil {
		begin.Queue(guard.SQL, guard.Args...)
	}
	begin.Queue(qLockRoot, did.String()).QueryRow(func(row pgx.Row) error {
		return row.Scan(&commitRaw, &dataRaw, &oldRev)
	})
	err := conn.SendBatch(ctx, begin).Close()
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, fmt.Errorf("%w: %s", ErrRepoNotFound, did)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("locking repo root: %w", db.Translate(err))
	}
	oldCommit, err := cid.Cast(commitRaw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: commit cid: %v", ErrCorruptRepo, err)
	}
	oldData, err := cid.Cast(dataRaw)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: data cid: %v", ErrCorruptRepo, err)
	}
	if swapCommit != nil && !swapCommit.Equals(oldCommit) {
		return nil, nil, fmt.Errorf("%w: the repo's commit is %s, not %s", ErrInvalidSwap, oldCommit, swapCommit)
	}

	st, err := e.loadState(ctx, conn, did.String(), oldData)
	if err != nil {
		return nil, nil, err
	}
	st.commit, st.rev = oldCommit, oldRev
	p, err := e.plan(ctx, st, did, key, writes)
	if err != nil {
		return nil, nil, err
	}
	if p.rows == nil {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return nil, nil, fmt.Errorf("ending an empty commit: %w", db.Translate(err))
		}
		return p.res, nil, nil
	}
	// The blob tracker may refuse the commit (a reference to a blob never
	// uploaded), so it runs before the batch that ends in COMMIT.
	if e.blobs != nil {
		if err := e.blobs.TrackTx(ctx, conn, did, p.res.Rev, p.blobChanges); err != nil {
			return nil, nil, err
		}
	}
	b := &pgx.Batch{}
	e.queue(b, p.rows, commitRaw)
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, fmt.Errorf("storing commit: %w", db.Translate(err))
	}
	p.finish()
	return p.res, st, nil
}

// commitPlan is a commit worked out from a repo state: its result, the rows
// it stores (nil when nothing changes), the records' blob references, and
// finish, which brings the state up to the new commit once it is stored.
type commitPlan struct {
	res         *CommitResult
	rows        *commitRows
	blobChanges []RecordBlobs
	finish      func()
}

// plan applies writes to st's tree and builds everything the commit stores,
// checking every limit. It does no I/O; st.tree is mutated, so st may go
// back into the cache only once the commit is stored.
func (e *Engine) plan(ctx context.Context, st *repoState, did syntax.DID, key atcrypto.PrivateKey, writes []preparedWrite) (*commitPlan, error) {
	oldCommit, oldData, oldRev := st.commit, st.data, st.rev

	var ops []*comatproto.SyncSubscribeRepos_RepoOp
	results := make([]WriteResult, 0, len(writes))
	var upserts, deletes []preparedWrite
	created := make(map[string]bool, len(writes))
	for _, w := range writes {
		var val *cid.Cid
		if w.Action != ActionDelete {
			c := w.cid
			val = &c
		}
		op, err := atrepo.ApplyOp(st.tree, w.path, val)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalidWrite, w.path, err)
		}
		if w.SwapRecord != nil && !sameCID(w.SwapRecord.CID, op.Prev) {
			return nil, fmt.Errorf("%w: record %s is %s, not %s", ErrInvalidSwap, w.path, cidString(op.Prev), cidString(w.SwapRecord.CID))
		}
		res := WriteResult{Action: w.Action, Collection: w.Collection, RKey: w.RKey, CID: w.cid}
		switch {
		case w.Action == ActionCreate && op.Prev != nil:
			return nil, fmt.Errorf("%w: %s", ErrRecordExists, w.path)
		case w.Action == ActionDelete && op.Prev == nil:
			return nil, fmt.Errorf("%w: %s", ErrRecordNotFound, w.path)
		case w.Action == ActionUpdate && op.Prev == nil:
			// putRecord on a missing record creates it.
			res.Action = ActionCreate
		case w.Action == ActionUpdate && op.Prev.Equals(w.cid):
			// Identical record: no operation to report.
			results = append(results, res)
			continue
		}
		results = append(results, res)
		if res.Action == ActionCreate {
			created[w.path] = true
		}
		rop := &comatproto.SyncSubscribeRepos_RepoOp{Action: string(res.Action), Path: w.path}
		if val != nil {
			l := lexutil.LexLink(*val)
			rop.Cid = &l
		}
		if op.Prev != nil {
			l := lexutil.LexLink(*op.Prev)
			rop.Prev = &l
		}
		ops = append(ops, rop)
		if w.Action == ActionDelete {
			deletes = append(deletes, w)
		} else {
			upserts = append(upserts, w)
		}
	}
	if len(ops) == 0 {
		return &commitPlan{res: &CommitResult{Commit: oldCommit, Rev: oldRev, Results: results}}, nil
	}

	// INDIGO.md trap 1: write the diff before asking for the root.
	diff := newDiffCollector()
	root, err := st.tree.WriteDiffBlocks(ctx, diff)
	if err != nil {
		return nil, fmt.Errorf("writing MST diff: %w", err)
	}

	rev := e.nextRev(oldRev)
	commit := atrepo.Commit{DID: did.String(), Version: atrepo.ATPROTO_REPO_VERSION, Data: *root, Rev: rev}
	if err := commit.Sign(key); err != nil {
		return nil, fmt.Errorf("signing commit: %w", err)
	}
	var cbuf bytes.Buffer
	if err := commit.MarshalCBOR(&cbuf); err != nil {
		return nil, fmt.Errorf("encoding commit: %w", err)
	}
	commitBytes := cbuf.Bytes()
	commitCID, err := cidBuilder.Sum(commitBytes)
	if err != nil {
		return nil, err
	}

	// The CAR relays receive: commit, new records, then MST nodes (new ones
	// and the unchanged neighbours indigo marks as proof).
	car := newCARBuilder(commitCID)
	car.add(commitCID, commitBytes)
	recordBytes := 0
	for _, w := range upserts {
		if car.add(w.cid, w.block) {
			recordBytes += len(w.block)
		}
	}
	nodeCIDs := make([][]byte, 0, len(diff.blocks))
	nodeData := make([][]byte, 0, len(diff.blocks))
	for _, b := range diff.blocks {
		car.add(b.Cid(), b.RawData())
		if _, stored := st.nodes[b.Cid()]; stored {
			// Rewritten unchanged (~6% of diff nodes): it is in the CAR
			// relays receive, and already in the database.
			continue
		}
		nodeCIDs = append(nodeCIDs, b.Cid().Bytes())
		nodeData = append(nodeData, b.RawData())
	}
	carBytes := car.bytes()
	if len(carBytes) > limits.MaxCommitBlocksBytes {
		return nil, &LimitError{
			Limit: LimitCommitBlocks, Size: len(carBytes), Max: limits.MaxCommitBlocksBytes,
			Detail: fmt.Sprintf("%d records totalling %s bytes", len(upserts), commas(recordBytes)),
		}
	}

	since := oldRev
	prevData := lexutil.LexLink(oldData)
	ev, err := eventlog.EncodeCommit(&comatproto.SyncSubscribeRepos_Commit{
		Repo:     did.String(),
		Commit:   lexutil.LexLink(commitCID),
		Rev:      rev,
		Since:    &since,
		Blocks:   carBytes,
		Ops:      ops,
		Blobs:    []lexutil.LexLink{},
		Time:     syntax.DatetimeNow().String(),
		PrevData: &prevData,
	})
	if err != nil {
		return nil, err
	}
	if ev.FrameSize() > limits.MaxFrameBytes {
		return nil, &LimitError{Limit: LimitFrame, Size: ev.FrameSize(), Max: limits.MaxFrameBytes}
	}

	removed, newKids, err := st.removedNodes(oldData, diff)
	if err != nil {
		return nil, err
	}

	rows := &commitRows{did: did.String(), rev: rev, ev: ev,
		commitCID: commitCID.Bytes(), commit: commitBytes, data: root.Bytes(),
		nodeCIDs: nodeCIDs, nodeData: nodeData, rmNodes: make([][]byte, len(removed))}
	for i, c := range removed {
		rows.rmNodes[i] = c.Bytes()
	}
	for _, w := range deletes {
		rows.delCols, rows.delRKeys = append(rows.delCols, string(w.Collection)), append(rows.delRKeys, string(w.RKey))
	}
	for _, w := range upserts {
		rows.upCols, rows.upRKeys = append(rows.upCols, string(w.Collection)), append(rows.upRKeys, string(w.RKey))
		rows.upCIDs, rows.upData = append(rows.upCIDs, w.cid.Bytes()), append(rows.upData, w.block)
	}
	var changes []RecordBlobs
	if e.blobs != nil {
		changes = make([]RecordBlobs, 0, len(upserts)+len(deletes))
		for _, w := range upserts {
			changes = append(changes, RecordBlobs{Collection: w.Collection, RKey: w.RKey, Blobs: atdata.ExtractBlobs(w.Record), Created: created[w.path]})
		}
		for _, w := range deletes {
			changes = append(changes, RecordBlobs{Collection: w.Collection, RKey: w.RKey})
		}
	}
	finish := func() {
		for _, c := range removed {
			st.size -= int64(len(st.nodes[c]))
			delete(st.nodes, c)
			delete(st.kids, c)
		}
		if st.kids == nil {
			st.kids = make(map[cid.Cid][]cid.Cid, len(newKids))
		}
		for c, kids := range newKids {
			st.kids[c] = kids
		}
		for _, b := range diff.blocks {
			if _, ok := st.nodes[b.Cid()]; !ok {
				st.nodes[b.Cid()] = b.RawData()
				st.size += int64(len(b.RawData()))
			}
		}
		st.data, st.commit, st.rev = *root, commitCID, rev
	}
	return &commitPlan{
		res:         &CommitResult{Commit: commitCID, Rev: rev, Results: results},
		rows:        rows,
		blobChanges: changes,
		finish:      finish,
	}, nil
}

// commitRows is everything one commit stores: the new root (commit CID,
// signed commit block, MST root CID, rev), MST nodes dropped and written,
// records deleted and upserted, the event.
type commitRows struct {
	did, rev                string
	commitCID, commit, data []byte
	rmNodes                 [][]byte
	nodeCIDs, nodeData      [][]byte
	delCols, delRKeys       []string
	upCols, upRKeys         []string
	upCIDs, upData          [][]byte
	ev                      *eventlog.Encoded
	// freshNodes: nodeCIDs are known not to be stored (the plan was made
	// from the cached tree of the root the commit moves from), so they are
	// inserted without ON CONFLICT.
	freshNodes bool
}

// queue adds the statement that stores c to b, moving the repo's root from
// commit old (the statement fails with db.ErrRootMoved if the root is not
// there): one call of bulwark_commit, which runs every write server-side.
func (e *Engine) queue(b *pgx.Batch, c *commitRows, old []byte) {
	b.Queue(qCommit, c.did, old, c.commitCID, c.commit, c.data, c.rev,
		c.rmNodes, c.nodeCIDs, c.nodeData, c.delCols, c.delRKeys, c.upCols, c.upRKeys, c.upCIDs, c.upData,
		string(c.ev.Kind), c.ev.RevArg(), c.ev.Body, c.ev.SeqOffset, c.ev.BlocksLen, c.ev.OpsCount, c.freshNodes)
}

// nextRev returns a TID above both the clock and the previous rev, so revs
// increase per repo even if the wall clock steps back or another process
// wrote last.
func (e *Engine) nextRev(prev string) string {
	rev := e.clock.Next()
	if prev != "" && rev.String() <= prev {
		if t, err := syntax.ParseTID(prev); err == nil {
			c := syntax.ClockFromTID(t)
			rev = c.Next()
		}
	}
	return rev.String()
}

// loadState returns did's tree at data: from the cache when it holds that
// exact root, otherwise from Postgres in one query.
func (e *Engine) loadState(ctx context.Context, q db.DBTX, did string, data cid.Cid) (*repoState, error) {
	if st := e.cache.take(did, data); st != nil {
		return st, nil
	}
	rows, err := q.Query(ctx, qLoadNodes, did)
	if err != nil {
		return nil, fmt.Errorf("loading MST nodes: %w", db.Translate(err))
	}
	nodes := nodeSource{}
	var size int64
	var raw, blk []byte
	_, err = pgx.ForEachRow(rows, []any{&raw, &blk}, func() error {
		c, err := cid.Cast(raw)
		if err != nil {
			return fmt.Errorf("%w: node cid: %v", ErrCorruptRepo, err)
		}
		nodes[c] = append([]byte(nil), blk...)
		size += int64(len(blk))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading MST nodes: %w", db.Translate(err))
	}
	tree, err := mst.LoadTreeFromStore(ctx, nodes, data)
	if err != nil {
		return nil, fmt.Errorf("%w: loading MST %s: %v", ErrCorruptRepo, data, err)
	}
	// INDIGO.md trap 2: a partial tree would silently skip proof nodes.
	if tree.IsPartial() {
		return nil, fmt.Errorf("%w: MST %s of %s is missing nodes", ErrCorruptRepo, data, did)
	}
	return &repoState{did: did, data: data, tree: tree, nodes: nodes, size: size}, nil
}

// removedNodes returns the nodes of st's tree before this commit (rooted
// at oldRoot) that the new tree no longer contains, and the children of the
// commit's new nodes. The new tree's nodes are the written diff plus
// unchanged subtrees those reference, so an old node is kept exactly when
// it was rewritten or a rewritten node points at it; the walk descends only
// through dropped nodes, so it costs about as much as the diff itself. Old
// nodes' children come from st.kids (filled as nodes are written, or on
// first use), so a commit decodes only the nodes it writes.
func (st *repoState) removedNodes(oldRoot cid.Cid, diff *diffCollector) ([]cid.Cid, map[cid.Cid][]cid.Cid, error) {
	kept := make(map[cid.Cid]bool, len(diff.blocks)*3)
	newKids := make(map[cid.Cid][]cid.Cid, len(diff.blocks))
	// The new nodes' children, read off the tree in memory (the nodes just
	// written are the root and the changed nodes under it, each reached
	// through its parent) rather than by decoding the blocks again.
	var walk func(n *mst.Node)
	walk = func(n *mst.Node) {
		if n == nil || n.CID == nil || newKids[*n.CID] != nil {
			return
		}
		if _, ok := diff.seen[*n.CID]; !ok {
			return
		}
		kids := make([]cid.Cid, 0, len(n.Entries))
		for _, e := range n.Entries {
			if e.ChildCID != nil {
				kids = append(kids, *e.ChildCID)
				walk(e.Child)
			}
		}
		newKids[*n.CID] = kids
	}
	walk(st.tree.Root)
	for _, b := range diff.blocks {
		kept[b.Cid()] = true
		kids, ok := newKids[b.Cid()]
		if !ok {
			// Not reached from the root in memory (cannot happen for a
			// complete tree): decode it.
			nd, err := mst.NodeDataFromCBOR(bytes.NewReader(b.RawData()))
			if err != nil {
				return nil, nil, fmt.Errorf("decoding new MST node: %w", err)
			}
			kids = nodeChildren(nd)
			newKids[b.Cid()] = kids
		}
		for _, c := range kids {
			kept[c] = true
		}
	}
	var removed []cid.Cid
	stack := []cid.Cid{oldRoot}
	for len(stack) > 0 {
		c := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if kept[c] {
			continue
		}
		removed = append(removed, c)
		kids, err := st.children(c)
		if err != nil {
			return nil, nil, err
		}
		stack = append(stack, kids...)
	}
	return removed, newKids, nil
}

// children returns the child nodes of node c of st's tree.
func (st *repoState) children(c cid.Cid) ([]cid.Cid, error) {
	if kids, ok := st.kids[c]; ok {
		return kids, nil
	}
	data, ok := st.nodes[c]
	if !ok {
		return nil, fmt.Errorf("%w: old MST node %s missing", ErrCorruptRepo, c)
	}
	nd, err := mst.NodeDataFromCBOR(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: decoding old MST node %s: %v", ErrCorruptRepo, c, err)
	}
	kids := nodeChildren(nd)
	if st.kids == nil {
		st.kids = make(map[cid.Cid][]cid.Cid)
	}
	st.kids[c] = kids
	return kids, nil
}

func nodeChildren(nd *mst.NodeData) []cid.Cid {
	var out []cid.Cid
	if nd.Left != nil {
		out = append(out, *nd.Left)
	}
	for _, e := range nd.Entries {
		if e.Right != nil {
			out = append(out, *e.Right)
		}
	}
	return out
}

func sameCID(a, b *cid.Cid) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Equals(*b)
}

func cidString(c *cid.Cid) string {
	if c == nil {
		return "absent"
	}
	return c.String()
}

// InitRepo creates did's empty repository with a signed genesis commit,
// inside tx (the account's creation transaction). It appends no event: the
// caller emits #identity, #account and #sync in the order it wants.
func (e *Engine) InitRepo(ctx context.Context, tx db.DBTX, did syntax.DID, key atcrypto.PrivateKey) (*Head, error) {
	tree := mst.NewEmptyTree()
	diff := newDiffCollector()
	root, err := tree.WriteDiffBlocks(ctx, diff)
	if err != nil {
		return nil, fmt.Errorf("encoding empty MST: %w", err)
	}
	rev := e.nextRev("")
	commit := atrepo.Commit{DID: did.String(), Version: atrepo.ATPROTO_REPO_VERSION, Data: *root, Rev: rev}
	if err := commit.Sign(key); err != nil {
		return nil, fmt.Errorf("signing genesis commit: %w", err)
	}
	var cbuf bytes.Buffer
	if err := commit.MarshalCBOR(&cbuf); err != nil {
		return nil, err
	}
	commitCID, err := cidBuilder.Sum(cbuf.Bytes())
	if err != nil {
		return nil, err
	}
	tag, err := tx.Exec(ctx, qInsertRoot, did.String(), commitCID.Bytes(), cbuf.Bytes(), root.Bytes(), rev)
	if err != nil {
		return nil, fmt.Errorf("storing repo root: %w", db.Translate(err))
	}
	if tag.RowsAffected() == 0 {
		return nil, fmt.Errorf("%w: %s", ErrRepoExists, did)
	}
	b := diff.blocks[0]
	if _, err := tx.Exec(ctx, qInsertNodes, did.String(), [][]byte{b.Cid().Bytes()}, rev, [][]byte{b.RawData()}); err != nil {
		return nil, fmt.Errorf("storing empty MST: %w", db.Translate(err))
	}
	return &Head{Commit: commitCID, CommitBytes: cbuf.Bytes(), Data: *root, Rev: rev}, nil
}

// DeleteRepoTx removes did's repository (records, MST nodes, root) inside
// tx, the account deletion's transaction, and drops its cached tree. Events
// stay in the log until they age out.
func (e *Engine) DeleteRepoTx(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	if _, err := tx.Exec(ctx, qLockRoot, did.String()); err != nil {
		return fmt.Errorf("locking repo root: %w", db.Translate(err))
	}
	for _, q := range qDeleteRepo {
		if _, err := tx.Exec(ctx, q, did.String()); err != nil {
			return fmt.Errorf("deleting repository: %w", db.Translate(err))
		}
	}
	e.cache.drop(did.String())
	return nil
}

// GetHead returns did's current commit.
func (e *Engine) GetHead(ctx context.Context, did syntax.DID) (*Head, error) {
	return getHead(ctx, e.pool, did)
}

func getHead(ctx context.Context, q db.DBTX, did syntax.DID) (*Head, error) {
	var h Head
	var commitRaw, dataRaw []byte
	err := q.QueryRow(ctx, qGetHead, did.String()).Scan(&commitRaw, &h.CommitBytes, &dataRaw, &h.Rev)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", ErrRepoNotFound, did)
	}
	if err != nil {
		return nil, fmt.Errorf("reading repo head: %w", db.Translate(err))
	}
	var err1, err2 error
	h.Commit, err1 = cid.Cast(commitRaw)
	h.Data, err2 = cid.Cast(dataRaw)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptRepo, err)
	}
	return &h, nil
}

// SyncEvent builds a #sync event for did's current commit (account creation,
// activation, import, repair), read through q so a caller's transaction sees
// its own writes.
func (e *Engine) SyncEvent(ctx context.Context, q db.DBTX, did syntax.DID) (*eventlog.Encoded, error) {
	return SyncEvent(ctx, q, did)
}

// SyncEvent is Engine.SyncEvent for callers without an engine (admin
// repair): it needs only the database.
func SyncEvent(ctx context.Context, q db.DBTX, did syntax.DID) (*eventlog.Encoded, error) {
	h, err := getHead(ctx, q, did)
	if err != nil {
		return nil, err
	}
	car := newCARBuilder(h.Commit)
	car.add(h.Commit, h.CommitBytes)
	return eventlog.EncodeSync(&comatproto.SyncSubscribeRepos_Sync{
		Did:    did.String(),
		Rev:    h.Rev,
		Blocks: car.bytes(),
		Time:   syntax.DatetimeNow().String(),
	})
}
