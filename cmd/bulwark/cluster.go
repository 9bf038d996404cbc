package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/cluster"
	"github.com/bulwark-pds/bulwark/config"
	"github.com/bulwark-pds/bulwark/internal/keyring"
	"github.com/bulwark-pds/bulwark/repo"
)

// Lease names of the singleton jobs: one node of the cluster runs each.
const (
	leaseFirehosePruner = "firehose-pruner"
	leaseBlobCollector  = "blob-collector"
	leaseOAuthCleanup   = "oauth-cleanup"
	// leaseRelayAlerts is the right to alert about relays: every node
	// watches them (its console shows them), one tells the webhook.
	leaseRelayAlerts = "relay-alerts"
)

// clusterRole is how this process takes part in the cluster of nodes that
// share its database: the leases its singleton jobs run under, its TID
// clock id, and the direct sessions pool.
type clusterRole struct {
	node     *cluster.Node // nil: not joined (a server built by a test, never started)
	leases   *cluster.Leases
	sessions *pgxpool.Pool

	mu       sync.Mutex
	onClock  func(uint) // the engine's SetClockID, once built
	clockID  uint
	hintConn *cluster.Hints // nil: none
}

// abandon leaves the cluster for a node whose start failed before its
// services ran: its row marked stopped, its hint socket closed.
func (r *clusterRole) abandon() {
	if r.node != nil {
		r.node.Leave()
	}
	if r.hintConn != nil {
		r.hintConn.Close()
	}
}

// joinCluster checks this node against the others on the database (the
// shared secrets and the blob store must agree) and claims its TID clock
// id. A disagreement stops the server with what to set.
func joinCluster(ctx context.Context, cfg *config.Config, d *database, logger *slog.Logger) (*clusterRole, error) {
	facts, err := clusterFacts(cfg)
	if err != nil {
		return nil, err
	}
	id := cluster.NewNodeID()
	r := &clusterRole{
		leases:   cluster.NewLeases(d.Pool, id, cluster.LeaseConfig{TTL: cfg.LeaseTimeout, Sessions: d.Sessions, Logger: logger}),
		sessions: d.Sessions,
	}
	r.node, err = cluster.Join(ctx, d.Pool, cluster.NodeConfig{
		ID: id, Version: Version(), Facts: facts, Logger: logger, OnClockID: r.setClockID,
	})
	if err != nil {
		return nil, err
	}
	r.clockID = r.node.ClockID()
	return r, nil
}

// standaloneRole is the role of a server built without joining (tests
// that build one and never start it): clock id 0, leases of its own.
func standaloneRole(pool *pgxpool.Pool) *clusterRole {
	return &clusterRole{leases: cluster.NewLeases(pool, cluster.NewNodeID(), cluster.LeaseConfig{}), sessions: pool}
}

// setClockID gives the engine the node's new clock id.
func (r *clusterRole) setClockID(id uint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clockID = id
	if r.onClock != nil {
		r.onClock(id)
	}
}

// useClock makes set receive the node's clock id, now and when it changes.
func (r *clusterRole) useClock(set func(uint)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onClock = set
	set(r.clockID)
}

// singleton runs run on one node of the cluster at a time, under the
// lease name.
func (r *clusterRole) singleton(name string, run func(context.Context) error) {
	r.leases.Add(name, func(ctx context.Context, _ cluster.Lease) error { return run(ctx) })
}

// holds reports whether this node holds the lease name now.
func (r *clusterRole) holds(name string) bool {
	for _, n := range r.leases.Holding() {
		if n == name {
			return true
		}
	}
	return false
}

// services are the node's heartbeat and the leases' loop.
func (r *clusterRole) services() []service {
	svcs := []service{{name: "leases", run: r.leases.Run}}
	if r.node != nil {
		svcs = append(svcs, service{name: "cluster node", run: r.node.Run})
	}
	return svcs
}

// clusterFacts are what every node on one database must agree on:
// fingerprints of the shared secrets (keyed with the rotation key, so the
// database tells nothing about them) and where blobs are kept.
func clusterFacts(cfg *config.Config) ([]cluster.Fact, error) {
	rotation, err := cfg.PLCRotationPrivateKey()
	if err != nil {
		return nil, err
	}
	key := rotation.Bytes()
	restart := "To change it, stop every node, then start them all with the new value."
	return []cluster.Fact{
		{
			Name: "plc-rotation-key", Value: cluster.Fingerprint(key, "plc-rotation-key", nil), Permanent: true,
			What: "the PLC rotation key (--plc-rotation-key, BULWARK_PLC_ROTATION_KEY), which also seals every account's signing key,",
			Hint: "Every node must use the key the database was first served with (in the first node's secret store, or its " +
				"<data-dir>/secrets/plc-rotation-key): with another, no account's signing key can be read and no DID updated.",
		},
		{
			Name: "jwt-secret", Value: cluster.Fingerprint(key, "jwt-secret", []byte(cfg.JWTSecret)),
			What: "the JWT secret (--jwt-secret, BULWARK_JWT_SECRET)",
			Hint: "Every node must use the same value, or a session made on one node is refused by the others. " + restart,
		},
		{
			Name: "admin-password", Value: cluster.Fingerprint(key, "admin-password", []byte(cfg.AdminPassword)),
			What: "the admin password (--admin-password, BULWARK_ADMIN_PASSWORD)",
			Hint: "Every node must use the same value, or the admin API and console work through some nodes only. " + restart,
		},
		{
			Name: "blob-store", Value: blobStoreFact(cfg), Public: true,
			What: "the blob store",
			Hint: "Every node must keep blobs in one store, or a blob uploaded through one node is BlobNotFound on the others: " +
				"an S3-compatible bucket (--blob-s3-bucket and --blob-s3-endpoint, the same on every node), or a directory every " +
				"node mounts at the same path, declared with --blob-dir-shared on each (see docs/SCALING.md).",
		},
	}, nil
}

// blobStoreFact names where this node keeps blobs. A directory not
// declared shared is this host's alone: two nodes on different hosts
// never agree on it.
func blobStoreFact(cfg *config.Config) string {
	switch {
	case cfg.BlobS3Bucket != "":
		endpoint := cfg.BlobS3Endpoint
		if endpoint == "" {
			endpoint = "AWS"
		}
		return fmt.Sprintf("S3 bucket %s at %s", cfg.BlobS3Bucket, endpoint)
	case cfg.BlobDirShared:
		return "shared directory " + cfg.BlobDir
	default:
		host, _ := os.Hostname()
		return fmt.Sprintf("directory %s on host %s (not shared)", cfg.BlobDir, host)
	}
}

// hints starts the node's commit hints when --cluster-hint-addr is set:
// engine's commits are told to the other nodes, theirs to engine.
func (r *clusterRole) hints(ctx context.Context, cfg *config.Config, engine *repo.Engine, logger *slog.Logger) ([]service, error) {
	if cfg.ClusterHintAddr == "" || r.node == nil {
		return nil, nil
	}
	ring, err := keyring.New([]byte(cfg.JWTSecret))
	if err != nil {
		return nil, err
	}
	h, err := cluster.ListenHints(ctx, r.node, cluster.HintConfig{
		Addr: cfg.ClusterHintAddr, Key: ring.Key(keyring.ClusterHint), Handle: engine.ReceiveHint, Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	engine.SetHintSender(h)
	r.hintConn = h
	logger.Info("commit hints on", "addr", cfg.ClusterHintAddr, "peers", h.Peers())
	return []service{{name: "cluster hints", run: h.Run}}, nil
}
