// Command bulwark-cluster tests "more nodes" on real components: a
// Postgres primary with a synchronous standby, SeaweedFS's S3 gateway,
// three `bulwark serve` nodes behind HAProxy (round robin), and PgBouncer
// in transaction mode. Under write load through the balancer it kills a
// node (kill -9), freezes the firehose sequencer's leader for 20 s
// (SIGSTOP), stops the primary and promotes the standby; after each, no
// acknowledged write may be missing, every node's firehose must be
// identical, gapless, without duplicates and every #commit must verify.
// It measures throughput and the share of commits rebuilt on one node,
// round robin over three and with each account kept on one node, the
// firehose stall while the leader is frozen (it must stay within the
// lease's bound), and the write outage of the failover.
//
//	bulwark-cluster --bulwark ./bulwark --weed ./weed --work /tmp/cluster
//
// scripts/cluster.sh builds what it needs and runs it (CI does).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
)

// Ports, as offsets from --base-port.
const (
	portPrimary     = 0
	portStandby     = 1
	portWeedMaster  = 10
	portWeedVolume  = 11
	portWeedFiler   = 12
	portS3          = 13
	portHints       = 20 // +i, UDP: each node's commit hints
	portHAProxy     = 30 // round robin over the three nodes
	portHAProxyHash = 31 // each account on one node (hash on Authorization)
	portHAProxyOne  = 32 // the first node only
	portNodes       = 40 // +i
	portMetrics     = 50 // +i
	portPgBouncer   = 60
)

const (
	s3AccessKey = "bulwark-cluster-test"
	s3SecretKey = "bulwark-cluster-test-secret-key"
	s3Bucket    = "bulwark"
)

// options are the flags.
type options struct {
	work, bulwarkBin, weedBin, pgBin, haproxyBin, pgbouncerBin string
	basePort, clients, writes, burst, rounds                   int
	freeze                                                     time.Duration
	keep                                                       bool
	// only, when "throughput", runs the throughput runs alone;
	// profileDir, when set, receives each node's CPU profile of the
	// first profileSeconds of each run.
	only, profileDir string
	profileSeconds   int
	// nodeCPU, when positive, is each node's CPU quota in cores.
	nodeCPU float64
	// hints gives each node a --cluster-hint-addr.
	hints bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("bulwark-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.work, "work", "", "work directory (default: a new one under /tmp)")
	fs.StringVar(&o.bulwarkBin, "bulwark", "", "the bulwark binary (required)")
	fs.StringVar(&o.weedBin, "weed", "", "the SeaweedFS weed binary (required)")
	fs.StringVar(&o.pgBin, "pg-bin", "", "directory of initdb, postgres and pg_basebackup (default: found in PATH or /usr/lib/postgresql/*/bin)")
	fs.StringVar(&o.haproxyBin, "haproxy", "", "the haproxy binary (default: from PATH)")
	fs.StringVar(&o.pgbouncerBin, "pgbouncer", "", "the pgbouncer binary (default: from PATH or /usr/sbin)")
	fs.IntVar(&o.basePort, "base-port", 31700, "first of the loopback ports used (up to +63)")
	fs.IntVar(&o.clients, "clients", 8, "concurrent writers")
	fs.IntVar(&o.writes, "writes", 2000, "writes of each throughput run")
	fs.IntVar(&o.burst, "burst", 4500, "writes without a record key in the burst spread over the nodes")
	fs.DurationVar(&o.freeze, "freeze", 20*time.Second, "how long the sequencer's leader is frozen")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds of the three throughput runs (one node, round robin, affinity), alternating")
	fs.StringVar(&o.only, "only", "", `"throughput": run the throughput runs alone (and check what they wrote)`)
	fs.StringVar(&o.profileDir, "profile", "", "directory for each node's CPU profile of each throughput run")
	fs.IntVar(&o.profileSeconds, "profile-seconds", 4, "length of those profiles (from each run's start)")
	fs.BoolVar(&o.hints, "hints", true, "nodes tell each other their commits (--cluster-hint-addr); false to measure without")
	fs.Float64Var(&o.nodeCPU, "node-cpu", 0, "each node's own CPU quota in cores (a cgroup each, as separate machines of that size; needs root)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.only != "" && o.only != "throughput" {
		fmt.Fprintln(stderr, `bulwark-cluster: --only takes "throughput"`)
		return 2
	}
	if o.bulwarkBin == "" || o.weedBin == "" {
		fmt.Fprintln(stderr, "bulwark-cluster: --bulwark and --weed are required")
		return 2
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			fmt.Fprintln(stderr, "bulwark-cluster:", err)
			return 1
		}
	}
	c, err := newCluster(o, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "bulwark-cluster:", err)
		return 1
	}
	defer c.teardown()
	if err := c.test(ctx); err != nil {
		fmt.Fprintln(stderr, "bulwark-cluster: FAILED:", err)
		for _, p := range c.procs {
			fmt.Fprintf(stderr, "--- %s (%s, tail) ---\n%s\n", p.name, p.log, p.tail())
		}
		return 1
	}
	fmt.Fprintln(stdout, "bulwark-cluster: every check passed")
	return 0
}

// cluster is the test's components and what it measured.
type cluster struct {
	o                                        options
	out                                      io.Writer
	work                                     string
	pgBin, weedBin, haproxyBin, pgbouncerBin string
	jwt, admin, rotation                     string
	primary, standby                         *postgres
	weed, haproxy                            *proc
	nodes                                    []*node
	cgroups                                  []*cpuCgroup
	procs                                    []*proc
	report                                   []string
	failures                                 []string
	dbURL                                    string
	currentPrimary                           *postgres
}

func newCluster(o options, out io.Writer) (*cluster, error) {
	c := &cluster{o: o, out: out, weedBin: o.weedBin}
	var err error
	if c.pgBin, err = findBinary(o.pgBin, []string{"initdb"}, pgBinDirs()...); err != nil {
		return nil, fmt.Errorf("postgres binaries: %w", err)
	}
	if o.pgBin == "" {
		// initdb may be a link into the server's directory, which holds
		// pg_basebackup too.
		if real, err := filepath.EvalSymlinks(c.pgBin); err == nil {
			c.pgBin = real
		}
		c.pgBin = filepath.Dir(c.pgBin)
	}
	if c.haproxyBin, err = findBinary(o.haproxyBin, []string{"haproxy"}, "/usr/sbin"); err != nil {
		return nil, fmt.Errorf("haproxy (apt-get install haproxy): %w", err)
	}
	if c.pgbouncerBin, err = findBinary(o.pgbouncerBin, []string{"pgbouncer"}, "/usr/sbin"); err != nil {
		return nil, fmt.Errorf("pgbouncer (apt-get install pgbouncer): %w", err)
	}
	c.work = o.work
	if c.work == "" {
		if c.work, err = os.MkdirTemp("", "bulwark-cluster-"); err != nil {
			return nil, err
		}
	}
	// The postgres user must reach its directories inside.
	if err := os.MkdirAll(c.work, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(c.work, 0o711); err != nil {
		return nil, err
	}
	c.jwt, c.admin = randomHex(32), randomHex(24)
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return nil, err
	}
	c.rotation = key.Multibase()
	return c, nil
}

func pgBinDirs() []string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	return append([]string{"/usr/local/bin"}, dirs...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *cluster) port(offset int) int { return c.o.basePort + offset }

func (c *cluster) lbURL() string { return fmt.Sprintf("http://127.0.0.1:%d", c.port(portHAProxy)) }

// logf prints a progress line.
func (c *cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.out, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// figure records a measured figure for the summary.
func (c *cluster) figure(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	c.report = append(c.report, line)
	c.logf("FIGURE %s", line)
}

// fail records a failed check; the run goes on, and fails at the end.
func (c *cluster) fail(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	c.failures = append(c.failures, line)
	c.logf("FAIL %s", line)
}

func (c *cluster) teardown() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(syscall.SIGTERM, 15*time.Second)
	}
	for _, g := range c.cgroups {
		g.remove()
	}
	if !c.o.keep {
		_ = os.RemoveAll(c.work)
	}
}

// createBucket makes the nodes' S3 bucket (an existing one is fine).
func (c *cluster) createBucket(ctx context.Context) error {
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(s3AccessKey, s3SecretKey, "")))
	if err != nil {
		return err
	}
	cl := s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(fmt.Sprintf("http://127.0.0.1:%d", c.port(portS3)))
		o.UsePathStyle = true
	})
	_, err = cl.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(s3Bucket)})
	if err != nil && !strings.Contains(err.Error(), "BucketAlreadyOwnedByYou") && !strings.Contains(err.Error(), "BucketAlreadyExists") {
		return err
	}
	return nil
}
