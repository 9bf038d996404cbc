package backup

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ipfs/go-cid"
)

// maxSecretBytes bounds one secret file.
const maxSecretBytes = 64 << 10

// Source is what a backup reads. Every field but DatabaseURL may be left
// zero.
type Source struct {
	// DatabaseURL is the database to dump. Required.
	DatabaseURL string
	// BlobDir is the disk blob store's directory; "" when blobs are not on
	// disk.
	BlobDir string
	// S3Bucket names the bucket blobs are kept in instead of BlobDir; it is
	// only recorded (the bucket is backed up with the provider's tools).
	S3Bucket string
	// SecretsDir holds the generated secrets (<data-dir>/secrets). Missing
	// is not an error: the secrets may come from the environment.
	SecretsDir string
	// Hostname is the server's public host name, recorded.
	Hostname string
	// Version is the bulwark version, recorded.
	Version string
	// PGBinDir holds pg_dump; "" searches (see findTool).
	PGBinDir string
	// Notes are added to the manifest's notes.
	Notes []string
	// Logger receives progress; nil means slog.Default().
	Logger *slog.Logger
}

// sink is where a backup's files go: a directory or a tar stream.
type sink interface {
	// dumpPath is where pg_dump writes the dump.
	dumpPath() string
	// dumpDone takes the finished dump into the backup and returns its
	// sha256 and size.
	dumpDone() (sum string, n int64, err error)
	// file adds a file of exactly size bytes read from r.
	file(name string, size int64, r io.Reader) error
	// finish adds the manifest, last.
	finish(m *Manifest) error
}

// ToDir writes a backup into dir, which must be missing or empty. The
// manifest is written last, once everything else is on disk.
func ToDir(ctx context.Context, src Source, dir string) (*Manifest, error) {
	if err := emptyDir(dir); err != nil {
		return nil, err
	}
	return create(ctx, src, &dirSink{dir: dir})
}

// ToTar writes a backup to w as a tar stream, manifest last. The dump is
// written to a file in tmpDir first (a tar entry needs its size up front)
// and removed when done.
func ToTar(ctx context.Context, src Source, w io.Writer, tmpDir string) (*Manifest, error) {
	tmp, err := os.MkdirTemp(tmpDir, "bulwark-backup-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	return create(ctx, src, &tarSink{tw: tar.NewWriter(w), tmp: tmp, now: time.Now()})
}

func create(ctx context.Context, src Source, s sink) (*Manifest, error) {
	logger := src.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if src.DatabaseURL == "" {
		return nil, errors.New("backup: no database URL")
	}
	m := &Manifest{Version: FormatVersion, BulwarkVersion: src.Version, CreatedAt: time.Now().UTC(), Hostname: src.Hostname, Notes: src.Notes}
	major, _, err := serverMajor(ctx, src.DatabaseURL)
	if err != nil {
		return nil, err
	}
	tool, err := findTool(ctx, "pg_dump", src.PGBinDir, major)
	if err != nil {
		return nil, err
	}
	logger.Info("dumping the database", "pg_dump", tool.path, "server_major", major)
	// Which nodes run and which holds each lease is state of the running
	// cluster, not data: a restored database starts with none.
	if err := runTool(ctx, tool, src.DatabaseURL, "--format=custom", "--no-password", "--file="+s.dumpPath(),
		"--exclude-table-data=cluster_nodes", "--exclude-table-data=cluster_leases"); err != nil {
		return nil, err
	}
	sum, n, err := s.dumpDone()
	if err != nil {
		return nil, fmt.Errorf("backup: database dump: %w", err)
	}
	m.Database = DatabaseInfo{File: DatabaseFile, Format: "pg_dump custom", SHA256: sum, Bytes: n, ServerMajor: major, DumpMajor: tool.major}
	logger.Info("database dumped", "bytes", n)

	if m.Secrets, err = copySecrets(src.SecretsDir, s); err != nil {
		return nil, err
	}
	switch {
	case src.BlobDir != "":
		m.Blobs = BlobsInfo{Store: StoreDisk, Dir: BlobsDir}
		if err := copyBlobs(ctx, src.BlobDir, s, &m.Blobs, logger); err != nil {
			return nil, err
		}
		logger.Info("blobs copied", "count", m.Blobs.Count, "bytes", m.Blobs.Bytes)
	case src.S3Bucket != "":
		m.Blobs = BlobsInfo{Store: StoreS3, S3Bucket: src.S3Bucket}
		m.Notes = append(m.Notes, fmt.Sprintf("blobs are in the S3 bucket %q and not in this backup: back the bucket up with the provider's tools", src.S3Bucket))
	}
	if err := s.finish(m); err != nil {
		return nil, err
	}
	return m, nil
}

// copySecrets adds the regular files of dir (not its dot files, which are
// secrets being written) to the backup.
func copySecrets(dir string, s sink) (SecretsInfo, error) {
	info := SecretsInfo{Dir: SecretsDir, Files: []SecretFile{}}
	if dir == "" {
		return info, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("backup: secrets: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := readBounded(filepath.Join(dir, e.Name()), maxSecretBytes)
		if err != nil {
			return info, fmt.Errorf("backup: secrets: %w", err)
		}
		sum := sha256.Sum256(b)
		if err := s.file(path.Join(SecretsDir, e.Name()), int64(len(b)), strings.NewReader(string(b))); err != nil {
			return info, err
		}
		info.Files = append(info.Files, SecretFile{Name: e.Name(), SHA256: hex.EncodeToString(sum[:])})
	}
	return info, nil
}

func readBounded(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, limit)
	}
	return b, nil
}

// copyBlobs adds the disk store's objects (<dir>/<xx>/<cid>) to the backup.
// Each file is opened before its size is read, so a blob deleted meanwhile
// is either copied whole or skipped, never cut short.
func copyBlobs(ctx context.Context, dir string, s sink, info *BlobsInfo, logger *slog.Logger) error {
	shards, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup: blobs: %w", err)
	}
	for _, shard := range shards {
		if !shard.IsDir() || len(shard.Name()) != 2 {
			continue // tmp/: uploads in progress
		}
		objects, err := os.ReadDir(filepath.Join(dir, shard.Name()))
		if err != nil {
			return fmt.Errorf("backup: blobs: %w", err)
		}
		for _, obj := range objects {
			if err := ctx.Err(); err != nil {
				return err
			}
			if !obj.Type().IsRegular() || !blobKeyValid(shard.Name(), obj.Name()) {
				logger.Warn("skipping a file that is not a blob", "file", filepath.Join(dir, shard.Name(), obj.Name()))
				continue
			}
			n, err := copyBlob(filepath.Join(dir, shard.Name(), obj.Name()), path.Join(BlobsDir, shard.Name(), obj.Name()), s)
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted since the listing
			}
			if err != nil {
				return fmt.Errorf("backup: blob %s: %w", obj.Name(), err)
			}
			info.Count++
			info.Bytes += n
		}
	}
	return nil
}

func copyBlob(src, name string, s sink) (int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), s.file(name, fi.Size(), f)
}

// blobKeyValid reports whether name is a CID filed under shard, its last
// two characters, as the disk store files objects.
func blobKeyValid(shard, name string) bool {
	if len(name) < 8 || name[len(name)-2:] != shard {
		return false
	}
	_, err := cid.Decode(name)
	return err == nil
}

// emptyDir creates dir (0700: a backup holds secrets) or checks that it is
// empty.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return os.MkdirAll(dir, 0o700)
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("backup: %s is not empty; give a new directory", dir)
	}
	return os.Chmod(dir, 0o700)
}

// dirSink writes a backup as files under dir.
type dirSink struct{ dir string }

func (d *dirSink) dumpPath() string { return filepath.Join(d.dir, DatabaseFile) }

func (d *dirSink) dumpDone() (string, int64, error) {
	if err := os.Chmod(d.dumpPath(), 0o600); err != nil {
		return "", 0, err
	}
	return fileSHA256(d.dumpPath())
}

func (d *dirSink) file(name string, size int64, r io.Reader) error {
	p := filepath.Join(d.dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != size {
		err = fmt.Errorf("%s: copied %d bytes, expected %d", name, n, size)
	}
	return err
}

func (d *dirSink) finish(m *Manifest) error {
	// One sync for every file written, rather than one per blob; then the
	// manifest, which marks the backup complete.
	syscall.Sync()
	return writeManifest(d.dir, m)
}

// tarSink writes a backup as a tar stream.
type tarSink struct {
	tw  *tar.Writer
	tmp string
	now time.Time
}

func (t *tarSink) dumpPath() string { return filepath.Join(t.tmp, DatabaseFile) }

func (t *tarSink) dumpDone() (string, int64, error) {
	f, err := os.Open(t.dumpPath())
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(t.dumpPath())
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	h := sha256.New()
	if err := t.file(DatabaseFile, fi.Size(), io.TeeReader(f, h)); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), fi.Size(), nil
}

func (t *tarSink) file(name string, size int64, r io.Reader) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600, ModTime: t.now, Format: tar.FormatPAX}
	if err := t.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyN(t.tw, r, size)
	if err != nil {
		return fmt.Errorf("%s: copied %d of %d bytes: %w", name, n, size, err)
	}
	return nil
}

func (t *tarSink) finish(m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if err := t.file(ManifestFile, int64(len(b)), strings.NewReader(string(b))); err != nil {
		return err
	}
	return t.tw.Close()
}
