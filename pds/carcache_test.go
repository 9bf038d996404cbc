package pds

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A new cache starts empty, and what an earlier run left (its files, and a
// directory an interrupted deletion left) goes away in the background.
func TestCARCacheClearsWhatARunLeft(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "car-cache")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	for _, name := range []string{"a.car", "b.car"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("old"), 0o600))
	}
	stale := dir + ".old-1"
	require.NoError(t, os.MkdirAll(stale, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(stale, "c.car"), []byte("older"), 0o600))

	c, err := newCARCache(dir, 1<<20)
	require.NoError(t, err)
	entries, err := os.ReadDir(c.dir)
	require.NoError(t, err)
	require.Empty(t, entries, "the new cache starts empty")
	require.Eventually(t, func() bool {
		left, _ := filepath.Glob(dir + ".old-*")
		return len(left) == 0
	}, 30*time.Second, 10*time.Millisecond, "the earlier runs' files are deleted")
}
