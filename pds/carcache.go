package pds

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-pds/bulwark/metrics"
)

// carCache keeps whole-repository CAR exports on disk, one per repository
// (at the commit it was built from), least recently served out first once
// the files pass max bytes. A scraper fleet asks for the same repositories
// over and over; from the cache each request is a file copy instead of a
// database export (100,000 records: ~0.3 s of Postgres and Go CPU), and it
// holds no database connection. A repository that moves on is exported
// again on its next request.
//
// Each file is charged at least carEntryMin bytes against max: a server of
// small repositories (a relay's crawl of a million accounts of a few KiB
// each) would otherwise keep hundreds of thousands of entries, and their
// bookkeeping in memory (~400 bytes each, times the collector's headroom)
// would grow with the accounts instead of the cap. A small repository is
// cheap to export again.
//
// The cache is only a cache: its directory is emptied at start.
type carCache struct {
	dir string
	max int64

	mu       sync.Mutex
	used     int64
	byDID    map[string]*list.Element // of *carFile
	lru      *list.List               // front = most recently served
	building map[string]*carBuild     // by did + commit
	seq      int
	// builds counts exports into the cache (for tests and metrics).
	builds atomic.Int64
}

type carFile struct {
	did, commit, path string
	size              int64
}

// carEntryMin is the least a cached file is charged against the cache's
// size: at most max/carEntryMin entries (16,384 for 1 GiB).
const carEntryMin = 64 << 10

// charge is what f counts against the cache's size.
func (f *carFile) charge() int64 { return max(f.size, carEntryMin) }

// carBuild is one export into the cache in progress; others asking for
// the same repository at the same commit wait for it.
type carBuild struct {
	done chan struct{}
	err  error
}

// newCARCache starts an empty cache in dir. What a previous run left there
// is moved aside at once and deleted in the background: tens of thousands
// of files (a relay's crawl fills the cache) took seconds to delete, and
// the server would not answer until they were gone.
func newCARCache(dir string, max int64) (*carCache, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return nil, fmt.Errorf("creating CAR cache: %w", err)
	}
	old := fmt.Sprintf("%s.old-%d", dir, time.Now().UnixNano())
	if err := os.Rename(dir, old); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("clearing CAR cache: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating CAR cache: %w", err)
	}
	// This run's and any a crash left mid-deletion.
	leftovers, _ := filepath.Glob(dir + ".old-*")
	go func() {
		for _, d := range leftovers {
			_ = os.RemoveAll(d)
		}
	}()
	return &carCache{dir: dir, max: max, byDID: map[string]*list.Element{}, lru: list.New(), building: map[string]*carBuild{}}, nil
}

// open returns the cached export of did at commit, opened, or nil. An open
// file stays readable even if it is evicted meanwhile.
func (c *carCache) open(did, commit string) (*os.File, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.openLocked(did, commit)
}

// openLocked is open with c.mu held.
func (c *carCache) openLocked(did, commit string) (*os.File, int64) {
	el, ok := c.byDID[did]
	if !ok {
		return nil, 0
	}
	cf := el.Value.(*carFile)
	if cf.commit != commit {
		return nil, 0
	}
	f, err := os.Open(cf.path)
	if err != nil {
		c.dropLocked(el)
		return nil, 0
	}
	c.lru.MoveToFront(el)
	metrics.CARCacheHits.Inc()
	return f, cf.size
}

// build exports did into the cache as of commit with export, unless
// another request is already doing so (then it waits for that one), and
// returns the file opened. export must write the repository as of commit
// or later.
func (c *carCache) build(ctx context.Context, did, commit string, export func(io.Writer) error) (*os.File, int64, error) {
	key := did + " " + commit
	c.mu.Lock()
	// Built while this request waited for its export slot? (Checked under
	// the same lock as the builds in progress, so a build that ends in
	// between is never missed.)
	if f, size := c.openLocked(did, commit); f != nil {
		c.mu.Unlock()
		return f, size, nil
	}
	if b, ok := c.building[key]; ok {
		c.mu.Unlock()
		select {
		case <-b.done:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
		if b.err != nil {
			return nil, 0, b.err
		}
		if f, size := c.open(did, commit); f != nil {
			return f, size, nil
		}
		return nil, 0, fmt.Errorf("CAR cache: export of %s was evicted at once", did)
	}
	b := &carBuild{done: make(chan struct{})}
	c.building[key] = b
	c.seq++
	sum := sha256.Sum256([]byte(key))
	path := filepath.Join(c.dir, fmt.Sprintf("%s-%d.car", hex.EncodeToString(sum[:8]), c.seq))
	c.mu.Unlock()

	c.builds.Add(1)
	metrics.CARCacheBuilds.Inc()
	size, err := writeFile(path, export)
	c.mu.Lock()
	delete(c.building, key)
	if err == nil {
		if el, ok := c.byDID[did]; ok {
			c.dropLocked(el)
		}
		cf := &carFile{did: did, commit: commit, path: path, size: size}
		c.byDID[did] = c.lru.PushFront(cf)
		c.used += cf.charge()
		for c.used > c.max && c.lru.Len() > 1 {
			c.dropLocked(c.lru.Back())
		}
		metrics.CARCacheBytes.Set(float64(c.used))
	}
	c.mu.Unlock()
	b.err = err
	close(b.done)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("CAR cache: %w", err)
	}
	return f, size, nil
}

// dropLocked forgets a cached file and deletes it. c.mu held.
func (c *carCache) dropLocked(el *list.Element) {
	cf := c.lru.Remove(el).(*carFile)
	delete(c.byDID, cf.did)
	c.used -= cf.charge()
	_ = os.Remove(cf.path)
}

// writeFile writes path with export, through a temporary file, so that the
// path exists only complete. It returns the size.
func writeFile(path string, export func(io.Writer) error) (int64, error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("CAR cache: %w", err)
	}
	cw := &countingWriter{w: f}
	err = export(cw)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return 0, err
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (cw *countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n += int64(n)
	return n, err
}
