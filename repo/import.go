package repo

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	atrepo "github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/limits"
)

//go:embed import.sql
var importSQL string

var importQueries = db.MustParseQueries(importSQL)

var (
	qImportDropStaging = importQueries.MustGet("ImportDropStaging")
	qImportCreate      = []string{
		qImportDropStaging,
		importQueries.MustGet("ImportCreateBlocks"),
		importQueries.MustGet("ImportCreateNodes"),
		importQueries.MustGet("ImportCreateEntries"),
	}
	qImportSettings      = importQueries.MustGet("ImportSettings")
	qImportIndexBlocks   = importQueries.MustGet("ImportIndexBlocks")
	qImportAnalyzeBlocks = importQueries.MustGet("ImportAnalyzeBlocks")
	qImportAnalyzeTree   = importQueries.MustGet("ImportAnalyzeTree")
	qImportNodeBatch     = importQueries.MustGet("ImportNodeBatch")
	qImportAddNodes      = importQueries.MustGet("ImportAddNodes")
	qImportAddEntries    = importQueries.MustGet("ImportAddEntries")
	qImportRecordPage    = importQueries.MustGet("ImportRecordPage")
	qImportDeleteRecords = importQueries.MustGet("ImportDeleteRecords")
	qImportDeleteNodes   = importQueries.MustGet("ImportDeleteNodes")
	qImportInsertNodes   = importQueries.MustGet("ImportInsertNodes")
	qImportInsertRecords = importQueries.MustGet("ImportInsertRecords")
	qImportSetRoot       = importQueries.MustGet("ImportSetRoot")
)

// DefaultMaxImportBytes is the largest CAR Import accepts by default: 1 GiB.
const DefaultMaxImportBytes = 1 << 30

// Import errors. Handlers map them to XRPC errors with errors.Is.
var (
	// ErrInvalidImport means the CAR is not a valid repository of the
	// account: malformed or truncated, a block whose bytes do not match
	// its CID, not exactly one root, a commit for another DID, a broken
	// MST, a missing block, a record that is not atproto data. The
	// message says which, naming the block or record.
	ErrInvalidImport = errors.New("invalid repository import")
	// ErrImportTooLarge is wrapped by every *ImportTooLargeError.
	ErrImportTooLarge = errors.New("repository import too large")
	// ErrImportRead means the CAR could not be read to its end (the client
	// went away or stalled). The read error is wrapped too.
	ErrImportRead = errors.New("reading the repository import failed")
)

// ImportTooLargeError reports a CAR over the import size limit. It is
// returned as soon as the stream passes the limit; nothing is stored.
type ImportTooLargeError struct {
	// Max is the limit, in bytes.
	Max int64
}

func (e *ImportTooLargeError) Error() string {
	return fmt.Sprintf("the repository CAR is larger than the import limit of %s bytes", commas(int(e.Max)))
}

// Unwrap makes errors.Is(err, ErrImportTooLarge) true.
func (e *ImportTooLargeError) Unwrap() error { return ErrImportTooLarge }

// OversizeRecord is an imported record over the protocol's per-record
// limits (limits.MaxRecordBlockBytes).
type OversizeRecord struct {
	// Path is the record's collection/rkey.
	Path string
	// Size is its block's size in bytes.
	Size int
}

// maxListedOversize bounds the oversize records an error or a result
// names; the rest are counted.
const maxListedOversize = 20

// OversizeRecordsError refuses a repository holding records over the
// per-record limits: relays drop such records, so they are imported only
// when ImportOptions.AllowOversize says so.
type OversizeRecordsError struct {
	// Records lists the first of them (up to 20), in path order.
	Records []OversizeRecord
	// Total is how many there are.
	Total int
}

func (e *OversizeRecordsError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the repository holds %d record(s) over the limit of %s bytes per record block: ", e.Total, commas(limits.MaxRecordBlockBytes))
	for i, r := range e.Records {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s bytes)", r.Path, commas(r.Size))
	}
	if more := e.Total - len(e.Records); more > 0 {
		fmt.Fprintf(&b, " and %d more", more)
	}
	b.WriteString("; the server's operator can allow importing them")
	return b.String()
}

// Unwrap makes errors.Is(err, ErrLimitExceeded) true.
func (e *OversizeRecordsError) Unwrap() error { return ErrLimitExceeded }

// ImportOptions tunes one Import. The zero value works.
type ImportOptions struct {
	// MaxBytes is the largest CAR accepted (default DefaultMaxImportBytes).
	MaxBytes int64
	// AllowOversize imports records over the per-record limits instead of
	// refusing the repository. They are stored, and served by reads and
	// getRepo, but never go out in a #commit: the import itself is
	// announced as #sync, and a later commit can only replace or delete
	// them.
	AllowOversize bool
	// InTx, when set, runs inside the import's transaction once the new
	// repository is written, before it commits (an admin's audit entry);
	// an error rolls the import back.
	InTx func(ctx context.Context, tx db.DBTX, res *ImportResult) error
}

// ImportResult reports a stored import.
type ImportResult struct {
	// Commit and Rev are the new commit, signed with the account's key.
	Commit cid.Cid
	Rev    string
	// Data is the MST root, the imported one.
	Data cid.Cid
	// Blocks and Bytes are what the CAR held; Records and Nodes what was
	// kept (blocks nothing refers to are dropped).
	Blocks, Bytes  int64
	Records, Nodes int64
	// BlobRefs counts the records' blob references recorded.
	BlobRefs int64
	// Oversize lists records over the per-record limits that were stored
	// (AllowOversize), up to 20; OversizeTotal counts them all.
	Oversize      []OversizeRecord
	OversizeTotal int
	// Elapsed is how long the import took.
	Elapsed time.Duration
}

// BlobRef is one blob an imported record refers to.
type BlobRef struct {
	// Path is the record's collection/rkey.
	Path string
	// CID is the blob's CID, as text.
	CID string
}

// BlobImporter is what Import needs from the engine's BlobTracker (when it
// has one) to record an imported repository's blob references. Import
// calls DropRefsTx, then AddRefsTx with every reference in batches, then
// SettleRefsTx, all in its transaction under the repo's lock.
type BlobImporter interface {
	// DropRefsTx forgets every blob reference of did's records: the
	// repository is being replaced.
	DropRefsTx(ctx context.Context, tx db.DBTX, did syntax.DID) error
	// AddRefsTx records references, which may name blobs did has not
	// uploaded (they are then missing until uploaded).
	AddRefsTx(ctx context.Context, tx db.DBTX, did syntax.DID, rev string, refs []BlobRef) error
	// SettleRefsTx makes did's blobs that records now refer to permanent,
	// and starts the expiry of those no record refers to any more.
	SettleRefsTx(ctx context.Context, tx db.DBTX, did syntax.DID) error
}

// Import replaces did's repository with the one in the CAR r streams (as
// sync.getRepo writes it, from this or another server): every block's CID
// is checked against its bytes, the root commit must be did's (its
// signature is the old server's and is not checked), the MST is walked
// from the commit's data root and checked node by node, and every record
// is checked against the data model and the per-record limits. The tree is
// then committed under a new rev signed with did's key, with a #sync
// event, in one transaction that also replaces the records' blob
// references (through the engine's BlobTracker, if it is a BlobImporter).
// Nothing is stored if any check fails.
//
// Memory does not grow with the CAR: blocks are copied into temporary
// tables of the import's database session as they arrive, a few MiB at a
// time, and the tree and the records are read back in bounded batches. No
// transaction is open while the CAR streams in, however slowly it comes;
// the repo's row lock is taken only once the CAR is staged and its tree
// checked.
func (e *Engine) Import(ctx context.Context, did syntax.DID, r io.Reader, opts ImportOptions) (*ImportResult, error) {
	start := time.Now()
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxImportBytes
	}
	key, err := e.keys.SigningKey(ctx, did)
	if err != nil {
		return nil, err
	}
	cr := newCARReader(r, opts.MaxBytes)
	root, err := cr.readHeader()
	if err != nil {
		return nil, err
	}
	imp := &importer{e: e, did: did, opts: opts, res: &ImportResult{}}
	if err := imp.open(ctx); err != nil {
		return nil, err
	}
	defer imp.close(ctx)
	commitBlock, err := imp.stage(ctx, cr, root)
	if err != nil {
		return nil, err
	}
	commit, err := imp.checkCommit(commitBlock, root)
	if err != nil {
		return nil, err
	}
	if imp.tx, err = imp.conn.Begin(ctx); err != nil {
		return nil, fmt.Errorf("starting import: %w", db.Translate(err))
	}
	defer func() { _ = imp.tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := imp.tx.Exec(ctx, qImportSettings); err != nil {
		return nil, fmt.Errorf("starting import: %w", db.Translate(err))
	}
	if err := imp.walk(ctx, commit.Data); err != nil {
		return nil, err
	}
	leave, err := e.enter(ctx, did.String())
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := imp.store(ctx, commit, key); err != nil {
		return nil, err
	}
	if opts.InTx != nil {
		if err := opts.InTx(ctx, imp.tx, imp.res); err != nil {
			return nil, err
		}
	}
	if err := imp.tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("committing import: %w", db.Translate(err))
	}
	e.cache.drop(did.String())
	if e.waker != nil {
		e.waker.Wake()
	}
	imp.res.Elapsed = time.Since(start)
	e.log.Info("repository imported", "did", did, "rev", imp.res.Rev, "records", imp.res.Records,
		"blocks", imp.res.Blocks, "bytes", imp.res.Bytes, "blob_refs", imp.res.BlobRefs,
		"oversize", imp.res.OversizeTotal, "elapsed", imp.res.Elapsed)
	return imp.res, nil
}

// importer is one Import in progress: its own connection (whose session
// holds the staging tables) and, once the CAR is staged, its transaction.
type importer struct {
	e    *Engine
	conn *pgxpool.Conn
	tx   pgx.Tx
	did  syntax.DID
	opts ImportOptions
	res  *ImportResult
}

// store replaces the account's repository with the staged one, under the
// repo's row lock: records (checked on the way), nodes, blob references,
// the new signed root and its #sync event. The rev is a TID after both the
// imported commit's and the repository's current one, so revs keep
// increasing for consumers of either.
func (imp *importer) store(ctx context.Context, commit *atrepo.Commit, key atcrypto.PrivateKey) error {
	tx, did := imp.tx, imp.did.String()
	var oldRev string
	err := db.Translate(tx.QueryRow(ctx, qLockRoot, did).Scan(new([]byte), new([]byte), &oldRev))
	if errors.Is(err, db.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrRepoNotFound, did)
	}
	if err != nil {
		return fmt.Errorf("locking repo root: %w", err)
	}
	rev := imp.e.nextRev(max(oldRev, commit.Rev))
	if _, err := tx.Exec(ctx, qImportAnalyzeTree); err != nil {
		return fmt.Errorf("analysing import: %w", db.Translate(err))
	}
	blobs, err := imp.blobImporter()
	if err != nil {
		return err
	}
	if blobs != nil {
		if err := blobs.DropRefsTx(ctx, tx, imp.did); err != nil {
			return err
		}
	}
	if err := imp.checkRecords(ctx, blobs, rev); err != nil {
		return err
	}
	for _, q := range []string{qImportDeleteRecords, qImportDeleteNodes} {
		if _, err := tx.Exec(ctx, q, did); err != nil {
			return fmt.Errorf("clearing the old repository: %w", db.Translate(err))
		}
	}
	tag, err := tx.Exec(ctx, qImportInsertNodes, did, rev)
	if err != nil {
		return fmt.Errorf("storing imported MST: %w", db.Translate(err))
	}
	imp.res.Nodes = tag.RowsAffected()
	if tag, err = tx.Exec(ctx, qImportInsertRecords, did, rev); err != nil {
		return fmt.Errorf("storing imported records: %w", db.Translate(err))
	}
	imp.res.Records = tag.RowsAffected()
	if blobs != nil {
		if err := blobs.SettleRefsTx(ctx, tx, imp.did); err != nil {
			return err
		}
	}
	commitCID, commitBytes, err := signCommit(imp.did, commit.Data, rev, key)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, qImportSetRoot, did, commitCID.Bytes(), commitBytes, commit.Data.Bytes(), rev); err != nil {
		return fmt.Errorf("storing imported root: %w", db.Translate(err))
	}
	ev, err := SyncEvent(ctx, tx, imp.did)
	if err != nil {
		return err
	}
	if err := eventlog.Append(ctx, tx, ev); err != nil {
		return err
	}
	imp.res.Commit, imp.res.Rev, imp.res.Data = commitCID, rev, commit.Data
	return nil
}

// blobImporter is the engine's blob tracker as a BlobImporter: nil when
// the engine tracks no blobs, an error when its tracker cannot take an
// import (the references would be lost).
func (imp *importer) blobImporter() (BlobImporter, error) {
	if imp.e.blobs == nil {
		return nil, nil
	}
	bi, ok := imp.e.blobs.(BlobImporter)
	if !ok {
		return nil, fmt.Errorf("the engine's blob tracker (%T) cannot record an import's blob references", imp.e.blobs)
	}
	return bi, nil
}
