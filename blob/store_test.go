package blob

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/require"
)

// backend builds one Store implementation for a test, plus a function
// listing the scratch files it leaves behind (which must be none).
type backend struct {
	name    string
	new     func(t *testing.T) Store
	scratch func(t *testing.T, s Store) []string
}

var backends = []backend{
	{
		name: "disk",
		new: func(t *testing.T) Store {
			s, err := NewDiskStore(filepath.Join(t.TempDir(), "blobs"))
			require.NoError(t, err)
			return s
		},
		scratch: func(t *testing.T, s Store) []string {
			return dirNames(t, filepath.Join(s.(*DiskStore).dir, "tmp"))
		},
	},
	{
		name: "s3",
		new:  newFakeS3Store,
		scratch: func(t *testing.T, s Store) []string {
			return dirNames(t, s.(*S3Store).spool)
		},
	},
}

// newFakeS3Store starts an in-process S3 server (gofakes3, in memory) and
// returns a store on a fresh bucket of it, through the real SDK client.
func newFakeS3Store(t *testing.T) Store {
	t.Helper()
	mem := s3mem.New()
	require.NoError(t, mem.CreateBucket("bulwark-test"))
	ts := httptest.NewServer(gofakes3.New(mem).Server())
	t.Cleanup(ts.Close)
	s, err := NewS3Store(context.Background(), S3Config{
		Bucket:    "bulwark-test",
		Endpoint:  ts.URL,
		Region:    "us-east-1",
		AccessKey: "test",
		SecretKey: "test-secret",
		Prefix:    "blobs/",
		SpoolDir:  t.TempDir(),
	})
	require.NoError(t, err)
	return s
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

func putObject(t *testing.T, s Store, data []byte) string {
	t.Helper()
	ctx := context.Background()
	w, err := s.Create(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	_, err = w.Write(data)
	require.NoError(t, err)
	key := ComputeCID(data).String()
	require.NoError(t, w.Commit(ctx, key))
	// Committing again (after a concurrent delete, say) is allowed.
	require.NoError(t, w.Commit(ctx, key))
	return key
}

func TestStoreRoundTrip(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.new(t)
			data := randomBytes(t, 300_000)
			key := putObject(t, s, data)
			require.Empty(t, b.scratch(t, s), "a closed writer leaves no scratch file")

			size, err := s.Stat(ctx, key)
			require.NoError(t, err)
			require.Equal(t, int64(len(data)), size)

			r, err := s.Open(ctx, key)
			require.NoError(t, err)
			got, err := io.ReadAll(r)
			require.NoError(t, err)
			require.True(t, bytes.Equal(data, got))

			// Ranges: seek around as http.ServeContent does.
			end, err := r.Seek(0, io.SeekEnd)
			require.NoError(t, err)
			require.Equal(t, int64(len(data)), end)
			_, err = r.Seek(1000, io.SeekStart)
			require.NoError(t, err)
			part := make([]byte, 500)
			_, err = io.ReadFull(r, part)
			require.NoError(t, err)
			require.Equal(t, data[1000:1500], part)
			_, err = r.Seek(-10, io.SeekEnd)
			require.NoError(t, err)
			tail, err := io.ReadAll(r)
			require.NoError(t, err)
			require.Equal(t, data[len(data)-10:], tail)
			require.NoError(t, r.Close())

			require.NoError(t, s.Delete(ctx, key))
			_, err = s.Stat(ctx, key)
			require.ErrorIs(t, err, ErrObjectNotFound)
			_, err = s.Open(ctx, key)
			require.ErrorIs(t, err, ErrObjectNotFound)
			require.NoError(t, s.Delete(ctx, key), "deleting a missing object is fine")
		})
	}
}

func TestStoreUncommittedLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.new(t)
			data := randomBytes(t, 1000)
			w, err := s.Create(ctx)
			require.NoError(t, err)
			_, err = w.Write(data)
			require.NoError(t, err)
			require.NoError(t, w.Close())
			_, err = s.Stat(ctx, ComputeCID(data).String())
			require.ErrorIs(t, err, ErrObjectNotFound)
			require.Empty(t, b.scratch(t, s))
		})
	}
}

func TestDiskStoreRefusesOddKeys(t *testing.T) {
	t.Parallel()
	s, err := NewDiskStore(t.TempDir())
	require.NoError(t, err)
	for _, key := range []string{"", "../../etc/passwd", "short", "bafk/../../x"} {
		_, err := s.Open(context.Background(), key)
		require.Error(t, err, key)
		require.NotErrorIs(t, err, ErrObjectNotFound, key)
	}
}

func TestComputeCID(t *testing.T) {
	t.Parallel()
	// The CID the reference PDS gives the bytes "hello world".
	require.Equal(t, "bafkreifzjut3te2nhyekklss27nh3k72ysco7y32koao5eei66wof36n5e", ComputeCID([]byte("hello world")).String())
}
