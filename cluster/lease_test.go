package cluster

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testTTL keeps the tests short; the ticks are a sixth of it.
const testTTL = 600 * time.Millisecond

// waitFor is how long a test waits for a lease to change hands: many
// times the TTL, for a loaded machine.
const waitFor = 30 * time.Second

// holderRun tracks one holder's job: how many run at once across holders
// (never more than one), and each run's context.
type holderRun struct {
	active  *atomic.Int32
	overlap *atomic.Bool
	started chan Lease
	ended   chan Lease
}

func (h holderRun) job(ctx context.Context, l Lease) error {
	if h.active.Add(1) > 1 {
		h.overlap.Store(true)
	}
	h.started <- l
	<-ctx.Done()
	h.active.Add(-1)
	h.ended <- l
	return nil
}

func newHolderRun(active *atomic.Int32, overlap *atomic.Bool) holderRun {
	return holderRun{active: active, overlap: overlap, started: make(chan Lease, 8), ended: make(chan Lease, 8)}
}

// runLeases runs l until the returned stop is called (or the test ends).
func runLeases(t *testing.T, l *Leases) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func recv(t *testing.T, ch <-chan Lease, what string) Lease {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(waitFor):
		t.Fatalf("timed out waiting for %s", what)
		return Lease{}
	}
}

// TestLeaseOneHolderAndHandover: of two holders one runs the job; when it
// stops, it releases the lease and the other takes it over with a higher
// epoch; the job never runs on both at once.
func TestLeaseOneHolderAndHandover(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	var active atomic.Int32
	var overlap atomic.Bool
	runs := [2]holderRun{newHolderRun(&active, &overlap), newHolderRun(&active, &overlap)}
	var stops [2]func()
	for i := range runs {
		l := NewLeases(pool, NewNodeID(), LeaseConfig{TTL: testTTL})
		l.Add("job", runs[i].job)
		stops[i] = runLeases(t, l)
	}
	var first Lease
	var leader int
	select {
	case first = <-runs[0].started:
		leader = 0
	case first = <-runs[1].started:
		leader = 1
	case <-time.After(waitFor):
		t.Fatal("no holder took the lease")
	}
	stops[leader]()
	recv(t, runs[leader].ended, "the stopped holder's job to end")
	second := recv(t, runs[1-leader].started, "the other holder to take over")
	require.Greater(t, second.Epoch, first.Epoch)
	require.False(t, overlap.Load(), "the job ran on both holders at once")
}

// TestLeaseTakenOverEndsJob: a holder whose lease another node took over
// (an operator's UPDATE stands in for a node that found it expired) ends
// its job at its next renewal.
func TestLeaseTakenOverEndsJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	var active atomic.Int32
	var overlap atomic.Bool
	run := newHolderRun(&active, &overlap)
	l := NewLeases(pool, NewNodeID(), LeaseConfig{TTL: testTTL})
	l.Add("job", run.job)
	runLeases(t, l)
	got := recv(t, run.started, "the lease to be taken")
	_, err := pool.Exec(ctx, `UPDATE cluster_leases SET holder = 'thief', epoch = epoch + 1, expires_at = 'infinity' WHERE name = 'job'`)
	require.NoError(t, err)
	ended := recv(t, run.ended, "the job to end")
	require.Equal(t, got, ended)
}

// TestLeaseLapsesWithoutDatabase: a holder that cannot reach the database
// ends its job once the lease would have expired, although nobody took
// it over: by the time another node may, it has stopped.
func TestLeaseLapsesWithoutDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	own, err := pgxpool.New(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	var active atomic.Int32
	var overlap atomic.Bool
	run := newHolderRun(&active, &overlap)
	l := NewLeases(own, NewNodeID(), LeaseConfig{TTL: testTTL})
	l.Add("job", run.job)
	runLeases(t, l)
	recv(t, run.started, "the lease to be taken")
	own.Close()
	recv(t, run.ended, "the job to end when renewals fail")
}

// TestLeaseFrozenHolder: a holder whose ticks stop (a frozen process)
// loses the lease to another holder after the TTL; its own job's context
// ends by its deadline even though its tick loop is stuck; and what it
// would publish with its old epoch is refused by the fencing check.
func TestLeaseFrozenHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	var active atomic.Int32
	var overlap atomic.Bool
	runA, runB := newHolderRun(&active, &overlap), newHolderRun(&active, &overlap)
	a := NewLeases(pool, "frozen-a", LeaseConfig{TTL: testTTL})
	a.Add("job", runA.job)
	runLeases(t, a)
	leaseA := recv(t, runA.started, "a to take the lease")

	freeze := make(chan struct{})
	a.mu.Lock()
	a.beforeTick = func() { <-freeze }
	a.mu.Unlock()
	defer close(freeze)

	b := NewLeases(pool, "b", LeaseConfig{TTL: testTTL})
	b.Add("job", runB.job)
	runLeases(t, b)
	recv(t, runA.ended, "the frozen holder's job to end by its deadline")
	leaseB := recv(t, runB.started, "b to take the lease over")
	require.Greater(t, leaseB.Epoch, leaseA.Epoch)

	err := Fence(ctx, pool, leaseA)
	require.ErrorIs(t, err, db.ErrFenced)
	require.NoError(t, Fence(ctx, pool, leaseB))
}

// TestLeaseTakenFromDeadHolder: when a holder's process is gone (its
// presence session ended, as a killed process's does), another takes its
// lease at once, long before the lease would expire.
func TestLeaseTakenFromDeadHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	var active atomic.Int32
	var overlap atomic.Bool
	runA, runB := newHolderRun(&active, &overlap), newHolderRun(&active, &overlap)
	// An hour: only the presence lock can hand the lease over in time.
	cfg := LeaseConfig{TTL: time.Hour, Tick: 50 * time.Millisecond}
	own, err := pgxpool.New(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	a := NewLeases(own, "a", cfg)
	a.Add("job", runA.job)
	runLeases(t, a)
	leaseA := recv(t, runA.started, "a to take the lease")
	b := NewLeases(pool, "b", cfg)
	b.Add("job", runB.job)
	runLeases(t, b)

	// a's sessions die, as they would with its process.
	own.Close()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1
		  AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`, a.key).Scan(&n))
	require.Equal(t, 1, n, "no presence session of a")
	leaseB := recv(t, runB.started, "b to take the lease of a holder whose process is gone")
	require.Greater(t, leaseB.Epoch, leaseA.Epoch)
}
