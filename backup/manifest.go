package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// FormatVersion is the manifest version this package writes. Restore
// refuses a backup of a later version.
const FormatVersion = 1

// Names inside a backup.
const (
	ManifestFile = "manifest.json"
	DatabaseFile = "database.dump"
	BlobsDir     = "blobs"
	SecretsDir   = "secrets"
)

// Blob store kinds a manifest records.
const (
	StoreDisk = "disk"
	StoreS3   = "s3"
)

// ErrCorrupt means a backup does not match its manifest: a checksum, a size
// or a count differs, or a file is missing or unexpected.
var ErrCorrupt = errors.New("backup: corrupt")

// maxManifestBytes bounds the manifest read back.
const maxManifestBytes = 1 << 20

// Manifest describes one backup. It is written last.
type Manifest struct {
	// Version is the manifest format (FormatVersion).
	Version int `json:"version"`
	// BulwarkVersion is the version of the binary that took the backup.
	BulwarkVersion string `json:"bulwarkVersion"`
	// CreatedAt is when the backup started (the database snapshot is
	// taken right after).
	CreatedAt time.Time `json:"createdAt"`
	// Hostname is the server's public host name: restored accounts' DIDs
	// point at it, so the restored server must be served under it.
	Hostname string `json:"hostname"`
	// Database is the pg_dump.
	Database DatabaseInfo `json:"database"`
	// Blobs is the blob store's content.
	Blobs BlobsInfo `json:"blobs"`
	// Secrets are the files of <data-dir>/secrets.
	Secrets SecretsInfo `json:"secrets"`
	// Notes are warnings for whoever restores: what is not in the backup.
	Notes []string `json:"notes,omitempty"`
}

// DatabaseInfo describes the database dump.
type DatabaseInfo struct {
	// File is the dump's name in the backup (DatabaseFile).
	File string `json:"file"`
	// Format is how it was written: "pg_dump custom".
	Format string `json:"format"`
	// SHA256 is the hex sha256 of the file.
	SHA256 string `json:"sha256"`
	// Bytes is the file's size.
	Bytes int64 `json:"bytes"`
	// ServerMajor is the major version of the Postgres it was dumped from.
	ServerMajor int `json:"serverMajor"`
	// DumpMajor is the major version of the pg_dump that wrote it; a
	// pg_restore at least this new is needed.
	DumpMajor int `json:"pgDumpMajor"`
}

// BlobsInfo describes the blobs in the backup.
type BlobsInfo struct {
	// Store is StoreDisk (the blobs are in the backup) or StoreS3 (they are
	// not: back up the bucket with the provider's tools).
	Store string `json:"store"`
	// Dir is where the blobs are in the backup (BlobsDir), for StoreDisk.
	Dir string `json:"dir,omitempty"`
	// Count and Bytes are the objects copied and their total size.
	Count int64 `json:"count"`
	Bytes int64 `json:"bytes"`
	// S3Bucket names the bucket, for StoreS3.
	S3Bucket string `json:"s3Bucket,omitempty"`
}

// SecretsInfo lists the secret files in the backup.
type SecretsInfo struct {
	// Dir is where they are in the backup (SecretsDir).
	Dir string `json:"dir"`
	// Files are the secrets, by name, with their sha256.
	Files []SecretFile `json:"files"`
}

// SecretFile is one secret file.
type SecretFile struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// ReadManifest reads the manifest of the backup in dir and checks that
// this package can restore its version.
func ReadManifest(dir string) (*Manifest, error) {
	f, err := os.Open(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s (an interrupted backup, or not a backup)", ErrCorrupt, dir, ManifestFile)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var m Manifest
	dec := json.NewDecoder(io.LimitReader(f, maxManifestBytes))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, ManifestFile, err)
	}
	if m.Version < 1 || m.Version > FormatVersion {
		return nil, fmt.Errorf("backup: %s is format version %d; this bulwark reads up to %d: restore with the bulwark that took it (%s) or newer", dir, m.Version, FormatVersion, m.BulwarkVersion)
	}
	if m.Database.File != DatabaseFile {
		return nil, fmt.Errorf("%w: database file %q, want %q", ErrCorrupt, m.Database.File, DatabaseFile)
	}
	return &m, nil
}

// writeManifest writes m into dir under a temporary name and renames it
// into place, so a manifest exists only complete.
func writeManifest(dir string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+ManifestFile+".tmp")
	if err := writeFileSync(tmp, append(b, '\n')); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestFile)); err != nil {
		return err
	}
	return syncDir(dir)
}

func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// fileSHA256 returns the hex sha256 and size of the file at path.
func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
