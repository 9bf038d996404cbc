package eventlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/cluster"
	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

// A short lease keeps the frozen-leader test short; the mechanism is the
// same at the default.
const (
	testLeaseTTL  = time.Second
	testLeaseTick = 100 * time.Millisecond
)

var identityN atomic.Int64

// appendIdentity appends one #identity event and returns its row id.
func appendIdentity(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	ctx := context.Background()
	enc, err := EncodeIdentity(&comatproto.SyncSubscribeRepos_Identity{
		Did: fmt.Sprintf("did:plc:leader%019d", identityN.Add(1)), Time: syntax.DatetimeNow().String(),
	})
	require.NoError(t, err)
	require.NoError(t, Append(ctx, pool, enc))
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(id) FROM events`).Scan(&id))
	return id
}

// waitSequenced waits until event id has a seq, and returns it.
func waitSequenced(t *testing.T, pool *pgxpool.Pool, id int64, within time.Duration) int64 {
	t.Helper()
	var seq *int64
	require.Eventually(t, func() bool {
		err := pool.QueryRow(context.Background(), `SELECT seq FROM events WHERE id = $1`, id).Scan(&seq)
		return err == nil && seq != nil
	}, within, 10*time.Millisecond, "event %d was not sequenced", id)
	return *seq
}

// TestFrozenLeaderIsReplaced: a sequencer process frozen with SIGSTOP
// (as a stalled VM or a network partition would leave it: alive, its
// connection open) is replaced by a follower once its lease lapses, and
// events committed meanwhile are numbered without waiting for it; when it
// wakes, its batches are fenced off.
func TestFrozenLeaderIsReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and freezes a sequencer process")
	}
	pool := dbtest.New(t)
	child := exec.Command(os.Args[0], "-test.run=^TestSequencerProcess$", "-test.v")
	child.Env = append(os.Environ(), "BULWARK_TEST_SEQUENCER_URL="+pool.Config().ConnString())
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	t.Cleanup(func() {
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Process.Kill()
		_ = child.Wait()
	})

	// The child leads: it numbers an event while no other sequencer runs.
	first := waitSequenced(t, pool, appendIdentity(t, pool), time.Minute)
	var holder string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT holder FROM cluster_leases WHERE name = $1`, SequencerLease).Scan(&holder))

	require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
	follower := NewSequencer(pool, SequencerConfig{LeaseTTL: testLeaseTTL, LeaderRetry: testLeaseTick, Logger: quietLogger()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = follower.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Within the lease's expiry and a tick (plus a machine's worth of
	// slack: no timing is asserted), with the leader still frozen.
	second := waitSequenced(t, pool, appendIdentity(t, pool), 30*time.Second)
	require.Equal(t, first+1, second)
	var now string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT holder FROM cluster_leases WHERE name = $1`, SequencerLease).Scan(&now))
	require.NotEqual(t, holder, now, "the frozen process still holds the lease")

	// Awake again, the old leader numbers nothing: the follower keeps
	// numbering in order.
	require.NoError(t, child.Process.Signal(syscall.SIGCONT))
	for range 3 {
		next := waitSequenced(t, pool, appendIdentity(t, pool), 30*time.Second)
		require.Equal(t, second+1, next)
		second = next
	}
}

// TestSequencerProcess is the sequencer TestFrozenLeaderIsReplaced
// freezes: it runs only as that test's child process.
func TestSequencerProcess(t *testing.T) {
	url := os.Getenv("BULWARK_TEST_SEQUENCER_URL")
	if url == "" {
		t.Skip("the child process of TestFrozenLeaderIsReplaced")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	seq := NewSequencer(pool, SequencerConfig{LeaseTTL: testLeaseTTL, LeaderRetry: testLeaseTick, Logger: quietLogger()})
	_ = seq.Run(ctx)
}

// TestSequencerFenced: a batch under a lease another holder has taken
// over numbers nothing and says so; the current holder's batch numbers.
func TestSequencerFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	_, err := pool.Exec(ctx, `INSERT INTO cluster_leases (name, holder, epoch, expires_at) VALUES ($1, 'b', 7, 'infinity')`, SequencerLease)
	require.NoError(t, err)
	id := appendIdentity(t, pool)
	seq := NewSequencer(pool, SequencerConfig{})

	_, err = seq.sequence(ctx, &cluster.Lease{Name: SequencerLease, Epoch: 6})
	require.ErrorIs(t, err, db.ErrFenced)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE id = $1 AND seq IS NULL`, id).Scan(&n))
	require.Equal(t, 1, n, "a fenced batch numbered an event")

	// Lead ends on the refusal, so the node gives the lease up.
	err = seq.Lead(ctx, cluster.Lease{Name: SequencerLease, Epoch: 6})
	require.True(t, errors.Is(err, db.ErrFenced), "Lead returned %v", err)

	got, err := seq.sequence(ctx, &cluster.Lease{Name: SequencerLease, Epoch: 7})
	require.NoError(t, err)
	require.Equal(t, 1, got)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
