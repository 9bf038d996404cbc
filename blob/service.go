package blob

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/repo"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qLockCID             = queries.MustGet("LockCID")
	qInsertBlob          = queries.MustGet("InsertBlob")
	qGetBlob             = queries.MustGet("GetBlob")
	qDeleteStaleRefs     = queries.MustGet("DeleteStaleRefs")
	qUpsertRefs          = queries.MustGet("UpsertRefs")
	qMakePermanent       = queries.MustGet("MakePermanent")
	qReleaseUnreferenced = queries.MustGet("ReleaseUnreferenced")
	qExpiredBlobs        = queries.MustGet("ExpiredBlobs")
	qDeleteExpiredBlob   = queries.MustGet("DeleteExpiredBlob")
	qObjectInUse         = queries.MustGet("ObjectInUse")
	qListBlobs           = queries.MustGet("ListBlobs")
	qListMissingBlobs    = queries.MustGet("ListMissingBlobs")
	qDeleteAccountRefs   = queries.MustGet("DeleteAccountRefs")
	qExpireAccountBlobs  = queries.MustGet("ExpireAccountBlobs")
)

// Defaults for Config.
const (
	// DefaultMaxBytes is the largest upload accepted: 100 MiB, the
	// reference PDS installer's PDS_BLOB_UPLOAD_LIMIT.
	DefaultMaxBytes = 100 << 20
	// DefaultTempTTL is how long an unreferenced blob is kept: time for a
	// client to upload an image and then post the record that uses it.
	DefaultTempTTL = time.Hour
)

// sniffLen is how many leading bytes http.DetectContentType looks at.
const sniffLen = 512

// gcBatch bounds the blobs one collection pass examines per query.
const gcBatch = 500

// Sentinel errors. Handlers map these to XRPC errors with errors.Is.
var (
	// ErrBlobNotFound means the account has no such blob (never uploaded,
	// expired, or not yet referenced by a record when being served).
	ErrBlobNotFound = errors.New("blob not found")
	// ErrTooLarge is wrapped by every *TooLargeError.
	ErrTooLarge = errors.New("blob too large")
	// ErrUploadRead means the upload's body could not be read to its end
	// (the client went away, stalled, or sent a malformed body). The read
	// error is wrapped too.
	ErrUploadRead = errors.New("reading the upload failed")
	// ErrInvalidMimeType means a record's blob reference names another
	// type than the one the blob is stored under.
	ErrInvalidMimeType = errors.New("blob reference names another type than the stored blob")
	// ErrInvalidSize means a record's blob reference names another size
	// than the stored blob's.
	ErrInvalidSize = errors.New("blob reference names another size than the stored blob")
)

// TooLargeError reports an upload over the size limit.
type TooLargeError struct {
	Max int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("blob is larger than the limit of %d bytes", e.Max)
}

// Unwrap makes errors.Is(err, ErrTooLarge) true.
func (e *TooLargeError) Unwrap() error { return ErrTooLarge }

// Config tunes a Service. The zero value works.
type Config struct {
	// MaxBytes is the largest blob accepted (default DefaultMaxBytes).
	MaxBytes int64
	// TempTTL is how long a blob no record refers to is kept before the
	// collector deletes it (default DefaultTempTTL).
	TempTTL time.Duration
	// GCInterval is how often Run collects (default TempTTL/4, at most
	// five minutes).
	GCInterval time.Duration
	// Logger is the component logger; nil means slog.Default().
	Logger *slog.Logger
}

// Service uploads, serves and collects blobs, and tracks which records
// refer to them. It implements repo.BlobTracker.
type Service struct {
	pool  *pgxpool.Pool
	store Store
	cfg   Config
	log   *slog.Logger
	now   func() time.Time
	// tick, when set (tests), replaces Run's GCInterval ticker.
	tick <-chan time.Time
	// passes, when set (tests), is told how many blobs each of Run's
	// collection passes deleted.
	passes chan<- int
}

var _ repo.BlobTracker = (*Service)(nil)

// New returns a Service keeping metadata in pool and bytes in store.
func New(pool *pgxpool.Pool, store Store, cfg Config) *Service {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.TempTTL <= 0 {
		cfg.TempTTL = DefaultTempTTL
	}
	if cfg.GCInterval <= 0 {
		cfg.GCInterval = min(cfg.TempTTL/4, 5*time.Minute)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{pool: pool, store: store, cfg: cfg, log: cfg.Logger.With("component", "blob"), now: time.Now}
}

// MaxBytes is the largest blob Upload accepts.
func (s *Service) MaxBytes() int64 { return s.cfg.MaxBytes }

// Blob describes a stored blob.
type Blob struct {
	CID      cid.Cid
	MimeType string
	Size     int64
}

// Ref returns the blob as it appears in records.
func (b *Blob) Ref() atdata.Blob {
	return atdata.Blob{Ref: atdata.CIDLink(b.CID), MimeType: b.MimeType, Size: b.Size}
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// Open returns a permanent blob of did (one some record refers to) and its
// bytes, seekable for range requests. The caller closes the reader.
// Temporary blobs are not served: an upload nobody has posted is not
// public, and the PDS is not a file host.
func (s *Service) Open(ctx context.Context, did syntax.DID, c cid.Cid) (*Blob, io.ReadSeekCloser, error) {
	b := &Blob{CID: c}
	var key string
	err := db.Translate(s.pool.QueryRow(ctx, qGetBlob, did.String(), c.String()).Scan(&b.MimeType, &b.Size, &key))
	if errors.Is(err, db.ErrNotFound) {
		return nil, nil, fmt.Errorf("%w: %s of %s", ErrBlobNotFound, c, did)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading blob: %w", err)
	}
	rc, err := s.store.Open(ctx, key)
	if errors.Is(err, ErrObjectNotFound) {
		s.log.Error("blob recorded but its object is missing", "did", did, "cid", key)
		return nil, nil, fmt.Errorf("%w: %s of %s (object missing)", ErrBlobNotFound, c, did)
	}
	if err != nil {
		return nil, nil, err
	}
	return b, rc, nil
}

// DeleteAccountTx implements account.Cleaner: inside the account deletion's
// transaction it drops the account's references and marks all its blobs
// expired, so the next collection deletes them.
func (s *Service) DeleteAccountTx(ctx context.Context, tx db.DBTX, did syntax.DID) error {
	for _, q := range []string{qDeleteAccountRefs, qExpireAccountBlobs} {
		if _, err := tx.Exec(ctx, q, did.String()); err != nil {
			return fmt.Errorf("releasing the account's blobs: %w", db.Translate(err))
		}
	}
	return nil
}

// TrackTx records the blob references of the records a commit touched
// (repo.BlobTracker). It runs in the commit's transaction, under the repo's
// lock: a reference to a blob did never uploaded (or that has expired)
// fails with ErrBlobNotFound and aborts the commit; referenced blobs become
// permanent; a blob whose last reference this commit removed starts its
// expiry clock again, so the collector deletes it after TempTTL (a grace
// period for a post that is deleted and made again).
func (s *Service) TrackTx(ctx context.Context, tx db.DBTX, did syntax.DID, rev string, changes []repo.RecordBlobs) error {
	if len(changes) == 0 {
		return nil
	}
	paths := make([]string, 0, len(changes))
	var refPaths, refCIDs []string
	wanted := map[string]bool{}
	// claims are what the records say of each blob, checked against the
	// stored blob when this commit is its first reference.
	claims := map[string][]atdata.Blob{}
	for _, ch := range changes {
		path := ch.Collection.String() + "/" + ch.RKey.String()
		if ch.Created && len(ch.Blobs) == 0 {
			// A new record without blobs: nothing to add, nothing to release.
			continue
		}
		paths = append(paths, path)
		seen := map[string]bool{}
		for _, b := range ch.Blobs {
			c := b.Ref.CID()
			if !c.Defined() {
				continue
			}
			k := c.String()
			claims[k] = append(claims[k], b)
			if seen[k] {
				continue
			}
			seen[k] = true
			refPaths = append(refPaths, path)
			refCIDs = append(refCIDs, k)
			wanted[k] = true
		}
	}

	if len(paths) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, qDeleteStaleRefs, did.String(), paths, refPaths, refCIDs)
	if err != nil {
		return fmt.Errorf("updating blob references: %w", db.Translate(err))
	}
	dropped, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("updating blob references: %w", db.Translate(err))
	}

	if len(refCIDs) > 0 {
		distinct := make([]string, 0, len(wanted))
		for k := range wanted {
			distinct = append(distinct, k)
		}
		sort.Strings(distinct) // so the error names the same blob every time
		rows, err := tx.Query(ctx, qMakePermanent, did.String(), distinct)
		if err != nil {
			return fmt.Errorf("making blobs permanent: %w", db.Translate(err))
		}
		found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[permanentRow])
		if err != nil {
			return fmt.Errorf("making blobs permanent: %w", db.Translate(err))
		}
		if err := checkClaims(found, claims); err != nil {
			return err
		}
		if len(found) != len(distinct) {
			have := map[string]bool{}
			for _, f := range found {
				have[f.CID] = true
			}
			for _, k := range distinct {
				if !have[k] {
					return fmt.Errorf("%w: a record refers to blob %s, which %s has not uploaded (or which expired); upload it first", ErrBlobNotFound, k, did)
				}
			}
		}
		if _, err := tx.Exec(ctx, qUpsertRefs, did.String(), refPaths, refCIDs, rev); err != nil {
			return fmt.Errorf("recording blob references: %w", db.Translate(err))
		}
	}

	var released []string
	for _, k := range dropped {
		if !wanted[k] {
			released = append(released, k)
		}
	}
	if len(released) > 0 {
		if _, err := tx.Exec(ctx, qReleaseUnreferenced, did.String(), released); err != nil {
			return fmt.Errorf("releasing blobs: %w", db.Translate(err))
		}
	}
	return nil
}

// ListBlobs returns the CIDs of blobs did's records refer to, in CID order
// after cursor, only those of records written after rev since when it is
// set. The returned cursor is "" at the end.
func (s *Service) ListBlobs(ctx context.Context, did syntax.DID, since, cursor string, limit int) ([]string, string, error) {
	rows, err := s.pool.Query(ctx, qListBlobs, did.String(), since, cursor, limit)
	if err != nil {
		return nil, "", fmt.Errorf("listing blobs: %w", db.Translate(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, "", fmt.Errorf("listing blobs: %w", db.Translate(err))
	}
	next := ""
	if len(out) == limit && limit > 0 {
		next = out[len(out)-1]
	}
	return out, next, nil
}

// MissingBlob is a blob a record refers to that the account has not
// uploaded (after a repository import).
type MissingBlob struct {
	CID string
	// RecordPath is one record (collection/rkey) that refers to it.
	RecordPath string
}

// ListMissing returns did's missing blobs in CID order after cursor.
func (s *Service) ListMissing(ctx context.Context, did syntax.DID, cursor string, limit int) ([]MissingBlob, string, error) {
	rows, err := s.pool.Query(ctx, qListMissingBlobs, did.String(), cursor, limit)
	if err != nil {
		return nil, "", fmt.Errorf("listing missing blobs: %w", db.Translate(err))
	}
	var out []MissingBlob
	var m MissingBlob
	_, err = pgx.ForEachRow(rows, []any{&m.CID, &m.RecordPath}, func() error {
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("listing missing blobs: %w", db.Translate(err))
	}
	next := ""
	if len(out) == limit && limit > 0 {
		next = out[len(out)-1].CID
	}
	return out, next, nil
}

// Run collects garbage every GCInterval until ctx ends. Several nodes may
// run it at once: each deletion is its own transaction under the CID's
// lock.
func (s *Service) Run(ctx context.Context) error {
	tick := s.tick
	if tick == nil {
		t := time.NewTicker(s.cfg.GCInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		n, err := s.Collect(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.log.Warn("blob collection failed; retrying later", "error", err)
		case n > 0:
			s.log.Info("expired blobs deleted", "count", n)
		}
		if s.passes != nil {
			select {
			case s.passes <- n:
			case <-ctx.Done():
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		}
	}
}

// Collect deletes every blob unreferenced for longer than TempTTL, and its
// stored object when no other account holds the same bytes. It returns
// how many blob rows it deleted.
func (s *Service) Collect(ctx context.Context) (int, error) {
	cutoff := s.now().Add(-s.cfg.TempTTL)
	total := 0
	for {
		rows, err := s.pool.Query(ctx, qExpiredBlobs, cutoff, gcBatch)
		if err != nil {
			return total, fmt.Errorf("finding expired blobs: %w", db.Translate(err))
		}
		type expired struct{ did, cid string }
		var batch []expired
		var e expired
		_, err = pgx.ForEachRow(rows, []any{&e.did, &e.cid}, func() error {
			batch = append(batch, e)
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("finding expired blobs: %w", db.Translate(err))
		}
		deleted := 0
		for _, e := range batch {
			ok, err := s.collect(ctx, e.did, e.cid, cutoff)
			if err != nil {
				return total, err
			}
			if ok {
				deleted++
			}
		}
		total += deleted
		// A batch in which nothing could be deleted (all raced with a
		// re-upload) would come back unchanged: stop rather than spin.
		if len(batch) < gcBatch || deleted == 0 {
			return total, nil
		}
	}
}

// collect deletes one expired blob row and, if it was the last holder of
// the object, the object, all under the CID's lock so that an upload of the
// same bytes cannot interleave.
func (s *Service) collect(ctx context.Context, did, key string, cutoff time.Time) (bool, error) {
	deleted := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qLockCID, key); err != nil {
			return db.Translate(err)
		}
		var storageKey string
		err := db.Translate(tx.QueryRow(ctx, qDeleteExpiredBlob, did, key, cutoff).Scan(&storageKey))
		if errors.Is(err, db.ErrNotFound) {
			return nil // referenced or re-uploaded meanwhile
		}
		if err != nil {
			return err
		}
		var inUse bool
		if err := tx.QueryRow(ctx, qObjectInUse, key).Scan(&inUse); err != nil {
			return db.Translate(err)
		}
		if !inUse {
			// Last step before commit: if the commit then fails the row
			// survives without its object, which Open reports and a
			// re-upload repairs.
			if err := s.store.Delete(ctx, storageKey); err != nil {
				return err
			}
		}
		deleted = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("deleting expired blob %s of %s: %w", key, did, err)
	}
	return deleted, nil
}

// permanentRow is a blob MakePermanent found: its stored type and size,
// and whether this commit made it permanent.
type permanentRow struct {
	CID     string
	Mime    string
	Size    int64
	WasTemp bool
}

// checkClaims compares what records say of a blob with the stored blob,
// for the blobs this commit is the first to refer to, as the reference
// PDS does: a reference must carry the type and size uploadBlob answered.
// Blobs already referenced (and those of an imported repository, whose
// references are recorded before their bytes arrive) are not checked
// again.
func checkClaims(found []permanentRow, claims map[string][]atdata.Blob) error {
	for _, f := range found {
		if !f.WasTemp {
			continue
		}
		for _, c := range claims[f.CID] {
			if c.MimeType != f.Mime {
				return fmt.Errorf("%w: blob %s is stored as %q, the record says %.100q", ErrInvalidMimeType, f.CID, f.Mime, c.MimeType)
			}
			if c.Size != f.Size {
				return fmt.Errorf("%w: blob %s is %d bytes, the record says %d", ErrInvalidSize, f.CID, f.Size, c.Size)
			}
		}
	}
	return nil
}
