package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// node is one `bulwark serve` process.
type node struct {
	name              string
	port, metricsPort int
	hintPort          int
	dataDir           string
	p                 *proc
	// extra are flags beside the cluster's own (a node behind PgBouncer).
	extra []string
	// cpu, with --node-cpu, is the node's own CPU quota.
	cpu *cpuCgroup
}

func (n *node) url() string { return fmt.Sprintf("http://127.0.0.1:%d", n.port) }

// args are the node's serve flags: every node the same but for its
// addresses and data directory.
func (c *cluster) nodeArgs(n *node, dbURL string) []string {
	var hints []string
	if c.o.hints && n.hintPort != 0 {
		hints = []string{"--cluster-hint-addr", fmt.Sprintf("127.0.0.1:%d", n.hintPort)}
	}
	return append(append([]string{c.o.bulwarkBin, "serve",
		"--listen", fmt.Sprintf("127.0.0.1:%d", n.port),
		"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", n.metricsPort),
		"--hostname", fmt.Sprintf("localhost:%d", c.port(portHAProxy)),
		"--data-dir", n.dataDir,
		"--database-url", dbURL,
		"--jwt-secret", c.jwt, "--admin-password", c.admin, "--plc-rotation-key", c.rotation,
		"--blob-s3-bucket", s3Bucket, "--blob-s3-endpoint", fmt.Sprintf("http://127.0.0.1:%d", c.port(portS3)),
		"--blob-s3-access-key", s3AccessKey, "--blob-s3-secret-key", s3SecretKey,
		"--trusted-proxies", "127.0.0.1/32", "--ratelimits", "off", "--firehose-allow", "127.0.0.0/8",
		"--log-format", "text",
	}, hints...), n.extra...)
}

// multiHostURL reaches whichever of the pair takes writes.
func (c *cluster) multiHostURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/bulwark?sslmode=disable&target_session_attrs=read-write",
		c.primary.port, c.standby.port)
}

func (c *cluster) newNode(i int) *node {
	return &node{name: fmt.Sprintf("node%d", i+1), port: c.port(portNodes + i), metricsPort: c.port(portMetrics + i), hintPort: c.port(portHints + i),
		dataDir: filepath.Join(c.work, fmt.Sprintf("node%d", i+1))}
}

// startNode starts n on dbURL and waits until it serves.
func (c *cluster) startNode(n *node, dbURL string) error {
	if err := os.MkdirAll(n.dataDir, 0o711); err != nil {
		return err
	}
	p, err := c.start(n.name, "", nil, c.nodeArgs(n, dbURL)...)
	if err != nil {
		return err
	}
	n.p = p
	if n.cpu != nil {
		if err := n.cpu.add(p.cmd.Process.Pid); err != nil {
			return fmt.Errorf("%s: its CPU quota: %w", n.name, err)
		}
	}
	return waitFor(p, 2*time.Minute, n.name+" serving", healthy(n.url()))
}

// refusedNode runs n on dbURL and requires it to stop at start; it
// returns its log.
func (c *cluster) refusedNode(n *node, dbURL string) (string, error) {
	p, err := c.start(n.name+"-refused", "", nil, c.nodeArgs(n, dbURL)...)
	if err != nil {
		return "", err
	}
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		p.stop(syscall.SIGTERM, 10*time.Second)
		return "", fmt.Errorf("%s started behind PgBouncer without a direct URL", n.name)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 {
		return "", fmt.Errorf("%s exited with %d, want 1", n.name, code)
	}
	b, err := os.ReadFile(p.log)
	return strings.ReplaceAll(string(b), `\n`, "\n"), err
}

// leader is the node holding the sequencer lease, by the pid in its
// holder name (host/pid/random).
func (c *cluster) leader(ctx context.Context) (*node, error) {
	conn, err := pgx.Connect(ctx, c.multiHostURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var holder string
	var live bool
	if err := conn.QueryRow(ctx, "SELECT holder, expires_at > clock_timestamp() FROM cluster_leases WHERE name = 'sequencer'").Scan(&holder, &live); err != nil {
		return nil, err
	}
	parts := strings.Split(holder, "/")
	if len(parts) != 3 || !live {
		return nil, fmt.Errorf("no live sequencer lease (%q)", holder)
	}
	for _, n := range c.nodes {
		if n.p != nil && n.p.running() && strconv.Itoa(n.p.cmd.Process.Pid) == parts[1] {
			return n, nil
		}
	}
	return nil, fmt.Errorf("the sequencer lease is held by %q, no node of ours", holder)
}

// pending is how many committed events wait for a seq, and the last seq.
func (c *cluster) sequencerState(ctx context.Context) (pending, last int64, err error) {
	conn, err := pgx.Connect(ctx, c.multiHostURL())
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, "SELECT (SELECT count(*) FROM events WHERE seq IS NULL), (SELECT last_seq FROM sequencer_state)").Scan(&pending, &last)
	return pending, last, err
}

// counters are the commit counters of the nodes' metrics, summed.
type counters struct{ commits, stale, refreshes, plans, checks, hinted float64 }

func (c *cluster) counters() counters {
	var out counters
	for _, n := range c.nodes {
		if n.p == nil || !n.p.running() {
			continue
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", n.metricsPort))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 {
				continue
			}
			v, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "bulwark_repo_commits_total":
				out.commits += v
			case "bulwark_repo_stale_roots_total":
				out.stale += v
			case "bulwark_repo_state_refreshes_total":
				out.refreshes += v
			case "bulwark_repo_commit_plans_total":
				out.plans += v
			case "bulwark_repo_root_checks_total":
				out.checks += v
			case `bulwark_repo_hints_total{outcome="applied"}`:
				out.hinted += v
			}
		}
		resp.Body.Close()
	}
	return out
}

func (a counters) minus(b counters) counters {
	return counters{commits: a.commits - b.commits, stale: a.stale - b.stale, refreshes: a.refreshes - b.refreshes, plans: a.plans - b.plans, checks: a.checks - b.checks, hinted: a.hinted - b.hinted}
}
