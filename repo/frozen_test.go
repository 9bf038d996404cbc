package repo

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
)

// stallingTracker is a BlobTracker that blocks inside the commit's
// transaction until released: a writer frozen (SIGSTOP, a stalled VM)
// while it holds the repo's row lock.
type stallingTracker struct {
	entered chan struct{}
	release chan struct{}
}

func (s *stallingTracker) TrackTx(ctx context.Context, _ db.DBTX, _ syntax.DID, _ string, _ []RecordBlobs) error {
	s.entered <- struct{}{}
	<-s.release
	return nil
}

// TestFrozenWriterReleasesRepo: a node that freezes in the middle of a
// commit, holding the repository's row lock, loses its session after the
// commit transaction's idle bound, and another node's write to the same
// repository goes through while the first is still frozen; the frozen
// commit, when it wakes, fails whole with a retryable error.
func TestFrozenWriterReleasesRepo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stall := &stallingTracker{entered: make(chan struct{}, 1), release: make(chan struct{})}
	b := setup(t, Config{Blobs: stall})
	did := b.newRepo(t, 1)
	other := New(b.pool, b.keys, nil, Config{counters: newCounters()})

	frozen := make(chan error, 1)
	go func() {
		// An update takes the locked path, where the tracker runs.
		_, err := b.engine.Apply(ctx, did, []Write{{Action: ActionUpdate, Collection: "app.bsky.feed.post", RKey: "frozen", Record: post("frozen")}}, nil)
		frozen <- err
	}()
	<-stall.entered
	var released sync.Once
	release := func() { released.Do(func() { close(stall.release) }) }
	t.Cleanup(release)

	// Far longer than the bound, so that a loaded machine still passes;
	// without the bound the write waits for the frozen one's lock.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := other.Apply(wctx, did, []Write{create("app.bsky.feed.post", "other", post("through"))}, nil)
	require.NoError(t, err, "the repository stayed locked by the frozen writer")

	release()
	err = <-frozen
	require.ErrorIs(t, err, db.ErrUnavailable)
	head, err := other.GetHead(ctx, did)
	require.NoError(t, err)
	require.Equal(t, res.Commit, head.Commit, "the frozen commit was half applied")
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM records WHERE did = $1 AND rkey = 'frozen'`, did.String()).Scan(&n))
	require.Zero(t, n)
}
