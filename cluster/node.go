package cluster

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/db"
)

//go:embed queries.sql
var queriesSQL string

var queries = db.MustParseQueries(queriesSQL)

var (
	qEnsureLeases  = queries.MustGet("EnsureLeases")
	qRenewLeases   = queries.MustGet("RenewLeases")
	qTakeLeases    = queries.MustGet("TakeLeases")
	qHoldPresence  = queries.MustGet("HoldPresence")
	qReleaseLeases = queries.MustGet("ReleaseLeases")
	qLeaseHolders  = queries.MustGet("LeaseHolders")
	qFenceLease    = queries.MustGet("FenceLease")
	qLockNodes     = queries.MustGet("LockNodes")
	qSeedNodes     = queries.MustGet("SeedNodes")
	qLiveNodes     = queries.MustGet("LiveNodes")
	qClaimClockID  = queries.MustGet("ClaimClockID")
	qNodeSeen      = queries.MustGet("NodeSeen")
	qNodeStopped   = queries.MustGet("NodeStopped")
	qGetFact       = queries.MustGet("GetFact")
	qSetFact       = queries.MustGet("SetFact")
	qSetHintAddr   = queries.MustGet("SetHintAddr")
	qHintPeers     = queries.MustGet("HintPeers")
)

const (
	// heartbeat is how often a node says it is alive.
	heartbeat = time.Second
	// liveWindow is how recently a node must have been seen to count as
	// running when another starts: a node killed without stopping stops
	// counting this long after.
	liveWindow = 10 * time.Second
	// clockIDReuse is how long a clock id must go unseen before another
	// node may claim it: a node frozen or cut off for less keeps its id.
	// With 1,024 ids and the one seen longest ago claimed first, an id
	// comes back only after every other has been used.
	clockIDReuse = time.Minute
)

// ErrNoClockID means every TID clock id is taken by a node seen within the
// last minute.
var ErrNoClockID = errors.New("cluster: all 1024 TID clock ids are in use by nodes seen within the last minute")

// NodeConfig describes the node that joins.
type NodeConfig struct {
	// ID names the node (NewNodeID); its leases are held under it.
	ID string
	// Version is the server's version, shown to other nodes.
	Version string
	// Facts are what every node of the cluster must agree on.
	Facts []Fact
	// OnClockID, when set, is called with a new clock id if the node's
	// was given to another after the node went unseen for a minute (a
	// long partition); the node claims a new one first.
	OnClockID func(uint)
	Logger    *slog.Logger
}

// Node is this process's membership of the cluster of Bulwark processes
// sharing one database: its TID clock id, its heartbeat, and the facts
// it was checked against.
type Node struct {
	pool *pgxpool.Pool
	cfg  NodeConfig
	host string
	log  *slog.Logger

	mu      sync.Mutex
	clockID uint
}

// Join checks cfg.Facts against the running nodes and the database's
// permanent facts, then claims a TID clock id, in one transaction (nodes
// joining at once take turns, so each sees the other). A disagreement is
// an error naming the setting and what to do; nothing is claimed then.
func Join(ctx context.Context, pool *pgxpool.Pool, cfg NodeConfig) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, _ := os.Hostname()
	n := &Node{pool: pool, cfg: cfg, host: host, log: cfg.Logger.With("component", "cluster", "node", cfg.ID)}
	var others []runningNode
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, q := range []string{qLockNodes, qSeedNodes} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return db.Translate(err)
			}
		}
		var err error
		if others, err = liveNodes(ctx, tx); err != nil {
			return err
		}
		if err := checkFacts(ctx, tx, cfg.ID, cfg.Facts, others); err != nil {
			return err
		}
		id, err := n.claim(ctx, tx)
		n.clockID = id
		return err
	})
	if err != nil {
		return nil, err
	}
	n.log.Info("joined the cluster", "clock_id", n.clockID, "other_nodes", len(others))
	return n, nil
}

// claim takes the clock id seen longest ago.
func (n *Node) claim(ctx context.Context, q db.DBTX) (uint, error) {
	facts, err := json.Marshal(factMap(n.cfg.Facts))
	if err != nil {
		return 0, err
	}
	var id int
	err = db.Translate(q.QueryRow(ctx, qClaimClockID, n.cfg.ID, clockIDReuse.Seconds(), n.host, n.cfg.Version, facts).Scan(&id))
	if errors.Is(err, db.ErrNotFound) {
		return 0, ErrNoClockID
	}
	if err != nil {
		return 0, fmt.Errorf("claiming a TID clock id: %w", err)
	}
	return uint(id), nil
}

// ClockID is the node's TID clock id (0-1023): record keys and revs this
// node makes carry it, so they differ from every other node's.
func (n *Node) ClockID() uint {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.clockID
}

// Run says every second that the node is alive, until ctx ends; then it
// marks the node stopped.
func (n *Node) Run(ctx context.Context) error {
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			n.Leave()
			return nil
		case <-t.C:
		}
		err := n.beat(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			n.log.Warn("node heartbeat failed", "err", err)
			failing = true
		case err == nil && failing:
			n.log.Info("node heartbeat works again")
			failing = false
		}
	}
}

// beat updates the node's row; if its clock id was given away, it claims
// another.
func (n *Node) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, heartbeat)
	defer cancel()
	id := n.ClockID()
	tag, err := n.pool.Exec(ctx, qNodeSeen, int(id), n.cfg.ID)
	if err != nil {
		return db.Translate(err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	newID, err := n.claim(ctx, n.pool)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.clockID = newID
	n.mu.Unlock()
	n.log.Warn("this node went unseen for over a minute and its TID clock id was given to another; using a new one",
		"old_clock_id", id, "clock_id", newID)
	if n.cfg.OnClockID != nil {
		n.cfg.OnClockID(newID)
	}
	return nil
}

// Leave marks the node stopped, so that it no longer counts as running
// (Run does when it ends; a node whose start fails before Run does it).
func (n *Node) Leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := n.pool.Exec(ctx, qNodeStopped, int(n.ClockID()), n.cfg.ID); err != nil {
		n.log.Warn("marking the node stopped", "err", db.Translate(err))
	}
}

// runningNode is another node seen recently.
type runningNode struct {
	clockID   int
	id, host  string
	version   string
	startedAt time.Time
	facts     map[string]string
}

func (r runningNode) String() string {
	return fmt.Sprintf("node %s on host %q (version %s, running since %s)", r.id, r.host, r.version, r.startedAt.UTC().Format(time.RFC3339))
}

func liveNodes(ctx context.Context, q db.DBTX) ([]runningNode, error) {
	rows, err := q.Query(ctx, qLiveNodes, liveWindow.Seconds())
	if err != nil {
		return nil, fmt.Errorf("reading running nodes: %w", db.Translate(err))
	}
	var out []runningNode
	var r runningNode
	var facts []byte
	var started *time.Time
	_, err = pgx.ForEachRow(rows, []any{&r.clockID, &r.id, &r.host, &r.version, &started, &facts}, func() error {
		r.facts = map[string]string{}
		if err := json.Unmarshal(facts, &r.facts); err != nil {
			return fmt.Errorf("node %s facts: %w", r.id, err)
		}
		r.startedAt = time.Time{}
		if started != nil {
			r.startedAt = *started
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading running nodes: %w", db.Translate(err))
	}
	return out, nil
}

// Nodes lists the nodes seen within the last ten seconds, for operators:
// one line each.
func Nodes(ctx context.Context, q db.DBTX) ([]string, error) {
	rs, err := liveNodes(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = fmt.Sprintf("clock id %d: %s", r.clockID, strings.TrimSpace(r.String()))
	}
	return out, nil
}
