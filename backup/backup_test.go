package backup

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
	"github.com/stretchr/testify/require"
)

// fixture writes a valid backup by hand: a dump, one secret, two blobs.
func fixture(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	dump := []byte("PGDMP fake dump")
	require.NoError(t, os.WriteFile(filepath.Join(dir, DatabaseFile), dump, 0o600))
	dumpSum := sha256.Sum256(dump)
	secret := []byte("s3cret\n")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, SecretsDir), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, SecretsDir, "jwt-secret"), secret, 0o600))
	secretSum := sha256.Sum256(secret)
	m := &Manifest{
		Version:  FormatVersion,
		Database: DatabaseInfo{File: DatabaseFile, SHA256: hex.EncodeToString(dumpSum[:]), Bytes: int64(len(dump))},
		Blobs:    BlobsInfo{Store: StoreDisk, Dir: BlobsDir},
		Secrets:  SecretsInfo{Dir: SecretsDir, Files: []SecretFile{{Name: "jwt-secret", SHA256: hex.EncodeToString(secretSum[:])}}},
	}
	var keys []string
	for _, content := range []string{"first blob", "second blob, longer"} {
		c, err := cid.NewPrefixV1(cid.Raw, multihash.SHA2_256).Sum([]byte(content))
		require.NoError(t, err)
		key := c.String()
		p := filepath.Join(dir, BlobsDir, key[len(key)-2:], key)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		m.Blobs.Count++
		m.Blobs.Bytes += int64(len(content))
		keys = append(keys, key)
	}
	require.NoError(t, writeManifest(dir, m))
	return dir, keys
}

func TestVerify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, keys := fixture(t)
	m, err := Verify(ctx, dir)
	require.NoError(t, err)
	require.Equal(t, int64(2), m.Blobs.Count)

	blob := func(dir string) string { return filepath.Join(dir, BlobsDir, keys[0][len(keys[0])-2:], keys[0]) }
	tests := []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"changed blob", func(d string) { require.NoError(t, os.WriteFile(blob(d), []byte("first blob!"), 0o600)) }, "does not match its CID"},
		{"missing blob", func(d string) { require.NoError(t, os.Remove(blob(d))) }, "the manifest says 2"},
		{"stray file", func(d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, BlobsDir, keys[0][len(keys[0])-2:], "notacid"), nil, 0o600))
		}, "is not a blob"},
		{"changed dump", func(d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, DatabaseFile), []byte("PGDMP fake dumq"), 0o600))
		}, DatabaseFile + " has sha256"},
		{"changed secret", func(d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, SecretsDir, "jwt-secret"), []byte("other\n"), 0o600))
		}, "secret jwt-secret"},
		{"no manifest", func(d string) { require.NoError(t, os.Remove(filepath.Join(d, ManifestFile))) }, "has no manifest.json"},
		{"future version", func(d string) {
			require.NoError(t, os.WriteFile(filepath.Join(d, ManifestFile), []byte(`{"version": 99, "database": {"file": "database.dump"}}`), 0o600))
		}, "format version 99"},
	}
	for _, tt := range tests {
		d, _ := fixture(t)
		// Same content, same CIDs: keys[0] names the first blob here too.
		tt.damage(d)
		_, err := Verify(ctx, d)
		require.Error(t, err, tt.name)
		require.Contains(t, err.Error(), tt.want, tt.name)
	}
}

// TestTarRoundTrip: a backup written as a stream unpacks to the same files,
// and a stream that names anything but a backup's files is refused.
func TestTarRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, _ := fixture(t)
	m, err := Verify(ctx, dir)
	require.NoError(t, err)

	var buf bytes.Buffer
	s := &tarSink{tw: tar.NewWriter(&buf)}
	for _, name := range []string{DatabaseFile, SecretsDir + "/jwt-secret"} {
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		require.NoError(t, err)
		require.NoError(t, s.file(name, int64(len(b)), bytes.NewReader(b)))
	}
	require.NoError(t, walkBlobs(filepath.Join(dir, BlobsDir), func(p, shard, name string) error {
		_, err := copyBlob(p, BlobsDir+"/"+shard+"/"+name, s)
		return err
	}))
	require.NoError(t, s.finish(m))

	b, err := OpenTar(ctx, bytes.NewReader(buf.Bytes()), filepath.Join(t.TempDir(), "staging"))
	require.NoError(t, err)
	require.Equal(t, m.Blobs, b.Manifest.Blobs)
	require.NoError(t, b.Close())
	require.NoDirExists(t, b.dir)

	for _, bad := range []string{"../escape", "/etc/passwd", "blobs/xx/notacid", "secrets/a/b", "other.txt"} {
		var evil bytes.Buffer
		tw := tar.NewWriter(&evil)
		require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: bad, Size: 1, Mode: 0o600}))
		_, _ = tw.Write([]byte("x"))
		require.NoError(t, tw.Close())
		staging := filepath.Join(t.TempDir(), "staging")
		_, err := OpenTar(ctx, &evil, staging)
		require.ErrorIs(t, err, ErrCorrupt, bad)
		require.NoDirExists(t, staging, "staging removed after a refused stream")
	}
}

func TestLibpqConn(t *testing.T) {
	t.Parallel()
	conn, pw := libpqConn("postgres://bulwark:p%40ss@db.example:5432/bulwark?sslmode=require&pool_max_conns=20&default_query_exec_mode=exec")
	require.Equal(t, "p@ss", pw)
	require.Equal(t, "postgres://bulwark@db.example:5432/bulwark?sslmode=require", conn)
	conn, pw = libpqConn("host=/run/postgresql dbname=bulwark")
	require.Equal(t, "host=/run/postgresql dbname=bulwark", conn)
	require.Empty(t, pw)
}

func TestParseMajor(t *testing.T) {
	t.Parallel()
	for line, want := range map[string]int{
		"pg_dump (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)\n": 15,
		"pg_restore (PostgreSQL) 9.6.24\n":                      9,
		"pg_dump (PostgreSQL) 17devel\n":                        17,
	} {
		got, err := parseMajor(line)
		require.NoError(t, err, line)
		require.Equal(t, want, got, line)
	}
	_, err := parseMajor("garbage")
	require.Error(t, err)
}
