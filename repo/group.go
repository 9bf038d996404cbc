package repo

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

// Group commit. Concurrent commits to different repos are stored together:
// one pipeline of their bulwark_commit calls (each after its guard) up to
// one Sync, so one implicit transaction, one round trip and one WAL flush
// for the group instead of one each. Postgres already shares a flush among
// commits that wait on it together; what grouping saves is the rest of a
// transaction's fixed cost on both sides (the round trip, the backend's
// wake-ups, commit bookkeeping), which at 16 writers is a good part of the
// CPU a commit costs on a small machine.
//
// There is no committer goroutine: a writer that finds fewer than
// maxLeaders groups in flight leads one, sending everything queued on its
// own connection; the others wait for their answer. A leader that
// finishes hands the lead to the first commit still queued.
//
// A commit whose root another process moved stores nothing and gets what
// its writer needs to catch up, while the rest of the group is stored
// (bulwark_try_commit). One failed statement (a refused session) rolls
// back the whole group; the leader then stores the group's commits one by
// one, so each gets its own answer, as if they had never been grouped. Commits are sent in DID order, so two processes grouping
// commits of the same repos lock their rows in the same order.

const (
	// maxGroup bounds the commits stored in one transaction, and
	// maxGroupBytes the bytes they send (a group is one pgx batch, encoded
	// whole before it is sent; commits of up to 2 MB of blocks each would
	// otherwise make it hundreds of MB). A commit larger than that goes in
	// a group of its own.
	maxGroup      = 64
	maxGroupBytes = 8 << 20
	// defaultGroupLeaders is how many groups may be in flight at once: two
	// keep Postgres busy on one while the next is being sent.
	defaultGroupLeaders = 2
	// groupTimeout bounds a group's round trip: its commits' own contexts
	// do not (one of them ending must not fail the others), and a writer
	// waits for its group's answer.
	groupTimeout = 30 * time.Second
)

type groupCommitter struct {
	mu         sync.Mutex
	queue      []*pendingCommit
	leaders    int
	maxLeaders int
}

// pendingCommit is one commit waiting in (or taken from) the group queue.
type pendingCommit struct {
	guard  *Guard
	params *commitParams
	// moved and err are the commit's outcome, set before done is closed:
	// moved is what the cache lacks when the root had moved (nothing was
	// stored), nil when the commit was stored.
	moved [][]byte
	err   error
	done  chan struct{} // closed when stored or refused
	lead  chan struct{} // a token: lead the next group
}

// useGroup reports whether a commit that found active commits in flight
// (itself included) should be stored in a group: a lone commit is sent at
// once.
func (e *Engine) useGroup(active int64) bool {
	return active > 1 && e.group.maxLeaders > 0
}

// storeGrouped stores one commit (its guard, then its params) with
// whatever other commits are waiting, and returns its outcome: see
// storeTry.
func (e *Engine) storeGrouped(ctx context.Context, lc *lazyConn, guard *Guard, params *commitParams) ([][]byte, error) {
	c := &pendingCommit{guard: guard, params: params, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	g := &e.group
	g.mu.Lock()
	g.queue = append(g.queue, c)
	lead := g.leaders < g.maxLeaders
	if lead {
		g.leaders++
	}
	g.mu.Unlock()
	for {
		if lead {
			e.leadGroup(ctx, lc)
			lead = false
		}
		select {
		case <-c.done:
			// A token given while this commit was still queued must not be
			// lost: lead once more (the queue may be empty by now).
			select {
			case <-c.lead:
				e.leadGroup(ctx, lc)
			default:
			}
			return c.moved, c.err
		case <-c.lead:
			lead = true
		}
	}
}

// leadGroup stores the queued commits as one group, then hands the lead on.
func (e *Engine) leadGroup(ctx context.Context, lc *lazyConn) {
	g := &e.group
	g.mu.Lock()
	n := groupLen(g.queue)
	batch := slices.Clone(g.queue[:n])
	g.queue = slices.Delete(g.queue, 0, n)
	g.mu.Unlock()
	if len(batch) > 0 {
		// A leader's request ending must not fail the commits of others;
		// a database that stops answering still must not hold them forever.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), groupTimeout)
		defer cancel()
		conn, err := lc.get(ctx)
		if err != nil {
			for _, c := range batch {
				c.err = err
				close(c.done)
			}
		} else {
			e.storeGroup(ctx, conn, batch)
		}
	}
	g.mu.Lock()
	g.leaders--
	if len(g.queue) > 0 && g.leaders < g.maxLeaders {
		select {
		case g.queue[0].lead <- struct{}{}:
			g.leaders++
		default:
			// It already holds a token and will lead.
		}
	}
	g.mu.Unlock()
}

// groupLen is how many commits from the head of queue make the next group:
// at most maxGroup and maxGroupBytes, at least one.
func groupLen(queue []*pendingCommit) int {
	n, size := 0, 0
	for n < len(queue) && n < maxGroup {
		size += queue[n].params.size()
		if n > 0 && size > maxGroupBytes {
			break
		}
		n++
	}
	return n
}

// storeGroup sends batch as one transaction; if it is refused, each commit
// alone.
func (e *Engine) storeGroup(ctx context.Context, conn *pgxpool.Conn, batch []*pendingCommit) {
	defer func() {
		for _, c := range batch {
			close(c.done)
		}
	}()
	if len(batch) == 1 {
		batch[0].moved, batch[0].err = storeTry(ctx, conn, batch[0].guard, batch[0].params)
		return
	}
	slices.SortFunc(batch, func(a, b *pendingCommit) int { return cmp.Compare(a.params.did, b.params.did) })
	b := &pgx.Batch{}
	for _, c := range batch {
		queueTry(b, c.guard, c.params, &c.moved)
	}
	err := send(ctx, conn, b)
	if err == nil {
		e.counters.commitGroups.Inc()
		e.counters.groupedCommits.Add(float64(len(batch)))
		return
	}
	// The group was rolled back whole: what a member read is void.
	for _, c := range batch {
		c.moved = nil
	}
	if !db.FromServer(err) {
		// Not an answer from the server: whether the group committed is
		// unknown (and send has closed the connection).
		for _, c := range batch {
			c.err = err
		}
		return
	}
	e.counters.groupRetries.Inc()
	for _, c := range batch {
		c.moved, c.err = storeTry(ctx, conn, c.guard, c.params)
	}
}

// storeTry sends one commit built on a cached tree (its guard, then its
// statement) as one implicit transaction. When the root had moved,
// nothing is stored and moved is what the cache lacks (see refresh.go).
func storeTry(ctx context.Context, conn *pgxpool.Conn, guard *Guard, params *commitParams) (moved [][]byte, err error) {
	b := &pgx.Batch{}
	queueTry(b, guard, params, &moved)
	if err := send(ctx, conn, b); err != nil {
		return nil, err
	}
	return moved, nil
}

// send sends b and reads every answer. A connection that failed without
// an answer from the server may be in any state, so it is closed (the
// pool then drops it).
func send(ctx context.Context, conn *pgxpool.Conn, b *pgx.Batch) error {
	err := conn.SendBatch(ctx, b).Close()
	if err != nil && !db.FromServer(err) {
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		return db.TranslateCall(err)
	}
	return err
}

// lazyConn is a pool connection acquired on first use: a commit that waits
// in a group holds none.
type lazyConn struct {
	pool *pgxpool.Pool
	conn *pgxpool.Conn
}

func (l *lazyConn) get(ctx context.Context) (*pgxpool.Conn, error) {
	if l.conn == nil {
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		l.conn = c
	}
	return l.conn, nil
}

func (l *lazyConn) release() {
	if l.conn != nil {
		l.conn.Release()
		l.conn = nil
	}
}
