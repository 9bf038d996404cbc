package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
)

// ErrNotEmpty means the target database already holds tables and Force was
// not set.
var ErrNotEmpty = errors.New("backup: the target database is not empty")

// Target is where a backup is restored. Every field but DatabaseURL may be
// left zero.
type Target struct {
	// DatabaseURL is the database to restore into: an empty one, unless
	// Force. Required.
	DatabaseURL string
	// BlobDir is the disk blob store's directory. Required when the
	// backup holds blobs.
	BlobDir string
	// SecretsDir receives the secret files (<data-dir>/secrets).
	SecretsDir string
	// PGBinDir holds pg_restore; "" searches (see findTool).
	PGBinDir string
	// Force restores over what is there: the dump's objects are dropped
	// and recreated (pg_restore --clean), blobs and secrets overwritten.
	Force bool
	// Logger receives progress; nil means slog.Default().
	Logger *slog.Logger
}

// Backup is a verified backup, ready to restore.
type Backup struct {
	// Manifest describes it.
	Manifest *Manifest
	dir      string
	// staged is set when dir was unpacked from a stream: its files may be
	// moved rather than copied, and Close removes it.
	staged bool
}

// Open reads the backup in dir and verifies it (Verify).
func Open(ctx context.Context, dir string) (*Backup, error) {
	m, err := Verify(ctx, dir)
	if err != nil {
		return nil, err
	}
	return &Backup{Manifest: m, dir: dir}, nil
}

// OpenTar unpacks a backup read as a tar stream (ToTar) into staging, a new
// or empty directory, and verifies it. Close removes staging. Put staging on
// the file system of the blob store, so that blobs are moved into place
// rather than copied.
func OpenTar(ctx context.Context, r io.Reader, staging string) (*Backup, error) {
	if err := emptyDir(staging); err != nil {
		return nil, err
	}
	b := &Backup{dir: staging, staged: true}
	if err := ExtractTar(r, staging); err != nil {
		b.Close()
		return nil, err
	}
	m, err := Verify(ctx, staging)
	if err != nil {
		b.Close()
		return nil, err
	}
	b.Manifest = m
	return b, nil
}

// Close removes the staging directory of a backup from OpenTar.
func (b *Backup) Close() error {
	if !b.staged {
		return nil
	}
	return os.RemoveAll(b.dir)
}

// Restore restores the backup into t: the database in one transaction
// (pg_restore --single-transaction), then the blobs and the secrets.
func (b *Backup) Restore(ctx context.Context, t Target) error {
	logger := t.Logger
	if logger == nil {
		logger = slog.Default()
	}
	m, dir := b.Manifest, b.dir
	if t.DatabaseURL == "" {
		return errors.New("backup: no database URL to restore into")
	}
	if m.Blobs.Store == StoreDisk && m.Blobs.Count > 0 && t.BlobDir == "" {
		return fmt.Errorf("backup: the backup holds %d blobs but the server keeps none on disk: restore into a disk store, or upload %s to the bucket yourself", m.Blobs.Count, filepath.Join(dir, BlobsDir))
	}
	major, relations, err := serverMajor(ctx, t.DatabaseURL)
	if err != nil {
		return err
	}
	if relations > 0 && !t.Force {
		return fmt.Errorf("%w: it holds %d tables or other relations; restore into a new database, or pass --force to replace the objects the backup holds", ErrNotEmpty, relations)
	}
	tool, err := findTool(ctx, "pg_restore", t.PGBinDir, max(m.Database.DumpMajor, major))
	if err != nil && major > m.Database.DumpMajor {
		tool, err = findTool(ctx, "pg_restore", t.PGBinDir, m.Database.DumpMajor)
	}
	if err != nil {
		return err
	}
	args := []string{"--no-owner", "--no-privileges", "--single-transaction", "--exit-on-error", "--no-password"}
	if t.Force {
		args = append(args, "--clean", "--if-exists")
	}
	logger.Info("restoring the database", "pg_restore", tool.path, "server_major", major)
	if err := runTool(ctx, tool, t.DatabaseURL, append(args, filepath.Join(dir, DatabaseFile))...); err != nil {
		return err
	}
	if m.Blobs.Store == StoreDisk && m.Blobs.Count > 0 {
		if err := placeBlobs(ctx, filepath.Join(dir, BlobsDir), t.BlobDir, b.staged); err != nil {
			return err
		}
		logger.Info("blobs restored", "count", m.Blobs.Count, "bytes", m.Blobs.Bytes, "dir", t.BlobDir)
	}
	if err := placeSecrets(dir, m.Secrets.Files, t.SecretsDir); err != nil {
		return err
	}
	syscall.Sync()
	return nil
}

// Verify checks the backup in dir against its manifest: the dump's size and
// sha256, every secret's sha256, and every blob's content against its CID
// and the blobs' count and size. It writes nothing.
func Verify(ctx context.Context, dir string) (*Manifest, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	sum, n, err := fileSHA256(filepath.Join(dir, DatabaseFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if sum != m.Database.SHA256 || n != m.Database.Bytes {
		return nil, fmt.Errorf("%w: %s has sha256 %s and %d bytes; the manifest says %s and %d", ErrCorrupt, DatabaseFile, sum, n, m.Database.SHA256, m.Database.Bytes)
	}
	if err := verifySecrets(dir, m.Secrets.Files); err != nil {
		return nil, err
	}
	if m.Blobs.Store != StoreDisk {
		return m, nil
	}
	var count, total int64
	err = walkBlobs(filepath.Join(dir, BlobsDir), func(p, shard, name string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		size, err := verifyBlob(p, name)
		count++
		total += size
		return err
	})
	if err != nil {
		return nil, err
	}
	if count != m.Blobs.Count || total != m.Blobs.Bytes {
		return nil, fmt.Errorf("%w: %d blobs of %d bytes in the backup; the manifest says %d of %d", ErrCorrupt, count, total, m.Blobs.Count, m.Blobs.Bytes)
	}
	return m, nil
}

func verifySecrets(dir string, files []SecretFile) error {
	for _, f := range files {
		if !safeName(f.Name) {
			return fmt.Errorf("%w: secret name %q", ErrCorrupt, f.Name)
		}
		sum, _, err := fileSHA256(filepath.Join(dir, SecretsDir, f.Name))
		if err != nil {
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if sum != f.SHA256 {
			return fmt.Errorf("%w: secret %s does not match its sha256", ErrCorrupt, f.Name)
		}
	}
	return nil
}

// safeName reports whether name is one plain file name.
func safeName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, `/\`)
}

// walkBlobs calls fn for every object of a blob directory laid out as the
// disk store does (<dir>/<xx>/<cid>); anything else there is corruption.
// A missing directory holds no blobs.
func walkBlobs(dir string, fn func(p, shard, name string) error) error {
	shards, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, shard := range shards {
		if !shard.IsDir() || len(shard.Name()) != 2 {
			return fmt.Errorf("%w: unexpected %s in %s", ErrCorrupt, shard.Name(), BlobsDir)
		}
		objects, err := os.ReadDir(filepath.Join(dir, shard.Name()))
		if err != nil {
			return err
		}
		for _, obj := range objects {
			if !obj.Type().IsRegular() || !blobKeyValid(shard.Name(), obj.Name()) {
				return fmt.Errorf("%w: %s/%s/%s is not a blob", ErrCorrupt, BlobsDir, shard.Name(), obj.Name())
			}
			if err := fn(filepath.Join(dir, shard.Name(), obj.Name()), shard.Name(), obj.Name()); err != nil {
				return err
			}
		}
	}
	return nil
}

// verifyBlob hashes the file at p with its CID's hash function and compares
// the digest with the CID's; it returns the file's size.
func verifyBlob(p, name string) (int64, error) {
	c, err := cid.Decode(name)
	if err != nil {
		return 0, fmt.Errorf("%w: blob %s: %v", ErrCorrupt, name, err)
	}
	dec, err := multihash.Decode(c.Hash())
	if err != nil {
		return 0, fmt.Errorf("%w: blob %s: %v", ErrCorrupt, name, err)
	}
	h, err := multihash.GetHasher(dec.Code)
	if err != nil {
		return 0, fmt.Errorf("%w: blob %s: %v", ErrCorrupt, name, err)
	}
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, err
	}
	sum := h.Sum(nil)
	if dec.Length >= 0 && dec.Length < len(sum) {
		sum = sum[:dec.Length]
	}
	if !bytes.Equal(sum, dec.Digest) {
		return 0, fmt.Errorf("%w: blob %s: its content does not match its CID", ErrCorrupt, name)
	}
	return n, nil
}

// placeBlobs puts the verified blobs of src into the disk store at dst, each
// through dst/tmp and a rename, as the store itself writes, so an object is
// never seen half written. With move, files are renamed from src when the
// file system allows. An object already in place is kept: same CID, same
// bytes.
func placeBlobs(ctx context.Context, src, dst string, move bool) error {
	tmp := filepath.Join(dst, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	return walkBlobs(src, func(p, shard, name string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		final := filepath.Join(dst, shard, name)
		if _, err := os.Stat(final); err == nil {
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
			return err
		}
		if move && os.Rename(p, final) == nil {
			return nil
		}
		return copyInto(p, tmp, final)
	})
}

// copyInto copies src to final through a temporary file in tmp.
func copyInto(src, tmp, final string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.CreateTemp(tmp, "restore-")
	if err != nil {
		return err
	}
	defer os.Remove(out.Name())
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(0o600); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(out.Name(), final)
}

// placeSecrets writes the backup's secret files into dst (0700; files
// 0600), each through a temporary file and a rename.
func placeSecrets(dir string, files []SecretFile, dst string) error {
	if len(files) == 0 {
		return nil
	}
	if dst == "" {
		return errors.New("backup: the backup holds secrets but no secrets directory was given")
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dst, 0o700); err != nil {
		return err
	}
	for _, f := range files {
		if err := copyInto(filepath.Join(dir, SecretsDir, f.Name), dst, filepath.Join(dst, f.Name)); err != nil {
			return fmt.Errorf("backup: secret %s: %w", f.Name, err)
		}
	}
	return syncDir(dst)
}
