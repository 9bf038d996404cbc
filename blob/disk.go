package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DiskStore keeps objects as files under a directory:
//
//	<dir>/<last two characters of the key>/<key>   objects
//	<dir>/tmp/                                      uploads in progress
//
// Every CID starts with the same prefix, so objects are spread over
// subdirectories by the key's last characters (base32 of the hash) to keep
// directories small. Uploads are written to tmp/ on the same file system,
// synced, and linked into place, so an object is never seen half written,
// even after a crash.
type DiskStore struct {
	dir string
}

// NewDiskStore returns a store under dir, creating it if needed. Leftover
// uploads of a previous run (a crash mid-upload) are removed.
func NewDiskStore(dir string) (*DiskStore, error) {
	if dir == "" {
		return nil, errors.New("blob: no directory for the disk store")
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("blob: creating %s: %w", tmp, err)
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return nil, fmt.Errorf("blob: reading %s: %w", tmp, err)
	}
	for _, e := range entries {
		_ = os.Remove(filepath.Join(tmp, e.Name()))
	}
	return &DiskStore{dir: dir}, nil
}

// path returns where key lives. Keys are CID strings; anything else that
// could escape the directory is refused.
func (d *DiskStore) path(key string) (string, error) {
	if len(key) < 8 || strings.ContainsAny(key, `/\.`) {
		return "", fmt.Errorf("blob: invalid object key %q", key)
	}
	return filepath.Join(d.dir, key[len(key)-2:], key), nil
}

// Create starts an upload in tmp/.
func (d *DiskStore) Create(context.Context) (Writer, error) {
	f, err := os.CreateTemp(filepath.Join(d.dir, "tmp"), "upload-")
	if err != nil {
		return nil, fmt.Errorf("blob: creating upload file: %w", err)
	}
	return &diskWriter{store: d, f: f}, nil
}

// Open opens the object's file.
func (d *DiskStore) Open(_ context.Context, key string) (io.ReadSeekCloser, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrObjectNotFound, key)
	}
	return f, err
}

// Stat returns the object's size.
func (d *DiskStore) Stat(_ context.Context, key string) (int64, error) {
	p, err := d.path(key)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("%w: %s", ErrObjectNotFound, key)
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// Delete removes the object's file.
func (d *DiskStore) Delete(_ context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

type diskWriter struct {
	store  *DiskStore
	f      *os.File
	synced bool
}

func (w *diskWriter) Write(p []byte) (int, error) { return w.f.Write(p) }

// Commit links the upload into place. A hard link rather than a rename
// keeps the upload file, so Commit can run again if a collector removed the
// object meanwhile; an existing object already holds these exact bytes.
func (w *diskWriter) Commit(_ context.Context, key string) error {
	p, err := w.store.path(key)
	if err != nil {
		return err
	}
	if !w.synced {
		if err := w.f.Sync(); err != nil {
			return fmt.Errorf("blob: syncing upload: %w", err)
		}
		w.synced = true
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("blob: creating %s: %w", dir, err)
	}
	if err := os.Link(w.f.Name(), p); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("blob: storing %s: %w", key, err)
	}
	// The link is durable only once its directory entry is.
	if df, err := os.Open(dir); err == nil {
		_ = df.Sync()
		_ = df.Close()
	}
	return nil
}

func (w *diskWriter) Close() error {
	err := w.f.Close()
	if rmErr := os.Remove(w.f.Name()); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) && err == nil {
		err = rmErr
	}
	return err
}
