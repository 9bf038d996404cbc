package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
	"github.com/bulwark-pds/bulwark/metrics"
)

// DefaultLeaseTTL is how long a lease lasts without a renewal: a holder
// that freezes or loses the database is replaced within DefaultLeaseTTL
// plus one tick (3.5 s), while one that is merely slow (a loaded machine,
// a garbage collection, a slow commit) renews six times within it.
const DefaultLeaseTTL = 3 * time.Second

// Job is work that one node of a cluster does at a time. It runs while its
// lease is held and must return soon after ctx ends: the lease was lost
// (another node took it over, or it could not be renewed in time) or the
// node is stopping. Whatever it publishes it should fence with the
// lease's epoch, as the sequencer does, since a holder that was frozen
// may run a little after it lost the lease before it notices.
type Job func(ctx context.Context, lease Lease) error

// Lease is one holding of a named lease. Epoch rises at every takeover.
type Lease struct {
	Name  string
	Epoch int64
}

// LeaseConfig tunes Leases. The zero value works.
type LeaseConfig struct {
	// TTL is how long a lease lasts without renewal (default
	// DefaultLeaseTTL).
	TTL time.Duration
	// Tick is how often held leases are renewed and free or expired ones
	// tried (default TTL/6). A lease whose holder stopped renewing is taken
	// over within TTL + Tick; one whose holder's process is gone, within a
	// Tick.
	Tick time.Duration
	// Sessions is the pool of direct connections (no transaction-mode
	// pooler) on which the holder keeps its presence lock (default: the
	// leases' pool).
	Sessions *pgxpool.Pool
	Logger   *slog.Logger
}

// Leases runs jobs under leases in Postgres, as one holder (one node).
// Every tick it renews the leases it holds and takes any free or expired
// one it wants, in one round trip; a job starts when its lease is taken
// and its context ends when the lease is lost, including when it could
// not be renewed before it would expire (so a node cut off from the
// database stops its jobs before another takes them over).
type Leases struct {
	pool   *pgxpool.Pool
	holder string
	// key is the holder's presence lock (an advisory lock held on a
	// session of its own while the process lives).
	key int64
	cfg LeaseConfig
	log *slog.Logger

	mu      sync.Mutex
	jobs    []*leaseJob
	runCtx  context.Context
	failing bool // the last tick failed (logged once per streak)
	// beforeTick, when set, runs before each tick (tests freeze a holder
	// with it).
	beforeTick func()
}

// leaseJob is one job and its lease's state, guarded by Leases.mu.
type leaseJob struct {
	name string
	run  Job

	epoch      int64 // 0: not held
	validUntil time.Time
	cancel     context.CancelFunc
	done       chan struct{} // closed when run returns; nil before the first start
	timer      *time.Timer
}

// running reports whether the job's last start has not returned yet.
func (j *leaseJob) running() bool {
	if j.done == nil {
		return false
	}
	select {
	case <-j.done:
		return false
	default:
		return true
	}
}

// NewLeases returns the leases of holder (a NodeID) over pool.
func NewLeases(pool *pgxpool.Pool, holder string, cfg LeaseConfig) *Leases {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.Tick <= 0 {
		cfg.Tick = cfg.TTL / 6
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Sessions == nil {
		cfg.Sessions = pool
	}
	h := fnv.New64a()
	h.Write([]byte("bulwark.node:" + holder))
	key := int64(h.Sum64())
	if key == 0 {
		key = 1
	}
	return &Leases{pool: pool, holder: holder, key: key, cfg: cfg, log: cfg.Logger.With("component", "lease", "node", holder)}
}

// Holder is the holder name these leases are taken as.
func (l *Leases) Holder() string { return l.holder }

// Add registers job under the lease name. Call it before Run.
func (l *Leases) Add(name string, job Job) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs = append(l.jobs, &leaseJob{name: name, run: job})
	metrics.LeaseHeld.WithLabelValues(name).Set(0)
}

// Run takes, holds and renews the leases until ctx ends, then stops the
// jobs, waits for them to return and releases their leases, so another
// node takes them at its next tick.
func (l *Leases) Run(ctx context.Context) error {
	l.mu.Lock()
	l.runCtx = ctx
	names := make([]string, len(l.jobs))
	for i, j := range l.jobs {
		names[i] = j.name
	}
	l.mu.Unlock()
	for {
		_, err := l.pool.Exec(ctx, qEnsureLeases, names)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		l.log.Warn("creating lease rows; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(l.cfg.Tick):
		}
	}
	// The presence lock first (or, if it cannot be had soon, without it:
	// leases still expire), so that no follower takes a lease of this
	// holder for a dead one.
	present := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	// It outlives ctx until the leases are released (stop).
	pctx, stopPresence := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPresence()
	wg.Go(func() { l.holdPresence(pctx, present) })
	select {
	case <-present:
	case <-time.After(l.cfg.TTL):
	case <-ctx.Done():
		return nil
	}
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	for {
		l.tick(ctx)
		select {
		case <-ctx.Done():
			l.stop()
			return nil
		case <-t.C:
		}
	}
}

// tick renews what is held, gives up what a job returned from, and takes
// what is wanted and free, in one round trip.
func (l *Leases) tick(ctx context.Context) {
	l.mu.Lock()
	hook := l.beforeTick
	l.mu.Unlock()
	if hook != nil {
		hook()
	}
	var renew, release []*leaseJob
	var want []string
	l.mu.Lock()
	for _, j := range l.jobs {
		switch {
		case j.epoch != 0 && !j.running():
			release = append(release, j)
		case j.epoch != 0:
			renew = append(renew, j)
		case !j.running():
			want = append(want, j.name)
		}
	}
	relNames, relEpochs := held(release)
	for _, j := range release {
		l.lose(j, "its job returned")
	}
	renewNames, renewEpochs := held(renew)
	l.mu.Unlock()

	b := &pgx.Batch{}
	if len(relNames) > 0 {
		b.Queue(qReleaseLeases, l.holder, relNames, relEpochs)
	}
	ttl := l.cfg.TTL.Seconds()
	renewed := map[string]int64{}
	if len(renewNames) > 0 {
		b.Queue(qRenewLeases, l.holder, renewNames, renewEpochs, ttl).Query(scanLeases(renewed))
	}
	taken := map[string]int64{}
	if len(want) > 0 {
		b.Queue(qTakeLeases, l.holder, want, ttl, l.key).Query(scanLeases(taken))
	}
	if b.Len() == 0 {
		return
	}
	sent := time.Now()
	// A tick that takes longer than this is of no use: the leases it would
	// renew are expiring locally by then.
	tctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/2)
	err := l.pool.SendBatch(tctx, b).Close()
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil && !l.failing {
			l.log.Warn("renewing leases failed; held leases lapse unless a later tick succeeds", "err", db.Translate(err))
		}
		l.failing = true
		return
	}
	if l.failing {
		l.log.Info("leases renewed again")
		l.failing = false
	}
	until := sent.Add(l.cfg.TTL)
	for _, j := range renew {
		switch {
		case j.epoch == 0:
			// Lost meanwhile (its deadline passed during the round trip).
		case renewed[j.name] == j.epoch:
			j.validUntil = until
		default:
			l.lose(j, "another node took it over")
		}
	}
	for _, j := range l.jobs {
		if epoch, ok := taken[j.name]; ok {
			l.start(j, epoch, until)
		}
	}
}

// holdPresence keeps the holder's presence lock on a session of its own
// until ctx ends, taking it again after a lost connection; ready is
// closed once it is first held. The session ends with the process, which
// tells the other holders that this one's leases are free.
func (l *Leases) holdPresence(ctx context.Context, ready chan<- struct{}) {
	var once sync.Once
	for ctx.Err() == nil {
		err := l.presenceOnce(ctx, func() { once.Do(func() { close(ready) }) })
		if ctx.Err() != nil {
			return
		}
		l.log.Warn("presence session lost; taking it again", "err", db.Translate(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(l.cfg.Tick):
		}
	}
}

func (l *Leases) presenceOnce(ctx context.Context, held func()) error {
	conn, err := l.cfg.Sessions.Acquire(ctx)
	if err != nil {
		return err
	}
	// The lock lives as long as the session: the connection never goes
	// back to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, qHoldPresence, l.key); err != nil {
		return err
	}
	held()
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, l.cfg.TTL)
		err := pc.Ping(pctx)
		cancel()
		if err != nil {
			return err
		}
	}
}

// held lists jobs' lease names and epochs.
func held(js []*leaseJob) ([]string, []int64) {
	names := make([]string, len(js))
	epochs := make([]int64, len(js))
	for i, j := range js {
		names[i], epochs[i] = j.name, j.epoch
	}
	return names, epochs
}

// scanLeases collects (name, epoch) rows into into.
func scanLeases(into map[string]int64) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		var name string
		var epoch int64
		_, err := pgx.ForEachRow(rows, []any{&name, &epoch}, func() error {
			into[name] = epoch
			return nil
		})
		return err
	}
}

// start runs j under its new lease. l.mu is held.
func (l *Leases) start(j *leaseJob, epoch int64, until time.Time) {
	ctx, cancel := context.WithCancel(l.runCtx)
	done := make(chan struct{})
	j.epoch, j.validUntil, j.cancel, j.done = epoch, until, cancel, done
	j.timer = time.AfterFunc(time.Until(until), func() { l.checkDeadline(j, epoch) })
	metrics.LeaseHeld.WithLabelValues(j.name).Set(1)
	metrics.LeaseTakeovers.WithLabelValues(j.name).Inc()
	l.log.Info("took lease", "lease", j.name, "epoch", epoch)
	lease := Lease{Name: j.name, Epoch: epoch}
	go func() {
		defer close(done)
		if err := j.run(ctx, lease); err != nil && ctx.Err() == nil {
			l.log.Warn("job under lease failed; giving the lease up", "lease", j.name, "epoch", epoch, "err", err)
		}
	}()
}

// checkDeadline ends j's holding if it was not renewed in time.
func (l *Leases) checkDeadline(j *leaseJob, epoch int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j.epoch != epoch {
		return
	}
	if left := time.Until(j.validUntil); left > 0 {
		j.timer.Reset(left)
		return
	}
	l.lose(j, "not renewed before it expired")
}

// lose ends j's holding: its context ends, and the lease is wanted again
// once the job has returned. l.mu is held.
func (l *Leases) lose(j *leaseJob, why string) {
	if j.epoch == 0 {
		return
	}
	if l.runCtx.Err() == nil {
		l.log.Warn("lost lease", "lease", j.name, "epoch", j.epoch, "reason", why)
	}
	j.epoch = 0
	j.cancel()
	j.timer.Stop()
	metrics.LeaseHeld.WithLabelValues(j.name).Set(0)
}

// stop ends every job, waits for them, and releases the leases they held.
func (l *Leases) stop() {
	l.mu.Lock()
	var holding []*leaseJob
	var dones []chan struct{}
	for _, j := range l.jobs {
		if j.epoch != 0 {
			holding = append(holding, j)
		}
		if j.done != nil {
			dones = append(dones, j.done)
		}
	}
	names, epochs := held(holding)
	for _, j := range holding {
		l.lose(j, "stopping")
	}
	l.mu.Unlock()
	for _, d := range dones {
		<-d
	}
	if len(names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
	defer cancel()
	if _, err := l.pool.Exec(ctx, qReleaseLeases, l.holder, names, epochs); err != nil {
		l.log.Warn("releasing leases; they lapse on their own", "err", db.Translate(err))
		return
	}
	l.log.Info("released leases", "leases", names)
}

// Holding lists the leases held now, by name.
func (l *Leases) Holding() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, j := range l.jobs {
		if j.epoch != 0 {
			out = append(out, j.name)
		}
	}
	slices.Sort(out)
	return out
}

// RunSingleton runs job under the lease name as a holder of its own until
// ctx ends: for a process (or a test) that runs one job alone, without a
// node's other leases.
func RunSingleton(ctx context.Context, pool *pgxpool.Pool, name string, job Job, cfg LeaseConfig) error {
	l := NewLeases(pool, NewNodeID(), cfg)
	l.Add(name, job)
	return l.Run(ctx)
}

// NewNodeID names one process of a cluster for leases and logs: host,
// process id and a random part, so a restarted process is a new holder.
func NewNodeID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "node"
	}
	if len(host) > 64 {
		host = host[:64]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Fence checks, through q (the transaction that publishes), that lease is
// still held at its epoch, and holds the lease row's share lock until q's
// transaction ends, so that no takeover commits in between. A lease
// another node took over is db.ErrFenced.
func Fence(ctx context.Context, q db.DBTX, lease Lease) error {
	var epoch int64
	if err := q.QueryRow(ctx, qFenceLease, lease.Name).Scan(&epoch); err != nil {
		return fmt.Errorf("checking lease %s: %w", lease.Name, db.Translate(err))
	}
	if epoch != lease.Epoch {
		return fmt.Errorf("lease %s is at epoch %d, not %d: %w", lease.Name, epoch, lease.Epoch, db.ErrFenced)
	}
	return nil
}

// LeaseState is a lease as the database has it.
type LeaseState struct {
	Name, Holder string
	Epoch        int64
	// Live is false once the lease has expired (or was released).
	Live bool
}

// LeaseStates reads every lease.
func LeaseStates(ctx context.Context, q db.DBTX) ([]LeaseState, error) {
	rows, err := q.Query(ctx, qLeaseHolders)
	if err != nil {
		return nil, fmt.Errorf("reading leases: %w", db.Translate(err))
	}
	var out []LeaseState
	var s LeaseState
	_, err = pgx.ForEachRow(rows, []any{&s.Name, &s.Holder, &s.Epoch, &s.Live}, func() error {
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading leases: %w", db.Translate(err))
	}
	return out, nil
}
