package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// leaseBound is the documented bound on how long a frozen leader stalls
// the other nodes' firehoses (docs/SCALING.md): the lease's 3 s, a tick,
// and margin for a loaded machine.
const leaseBound = 5 * time.Second

// test sets the cluster up and runs every phase. A failed check is
// recorded and the run goes on; it fails at the end.
func (c *cluster) test(ctx context.Context) error {
	start := time.Now()
	if err := c.setup(ctx); err != nil {
		return err
	}
	lb := newClient(c.lbURL(), 30*time.Second)
	direct := c.nodeClients(30 * time.Second)
	accounts := make([]*account, c.o.clients+4)
	for i := range accounts {
		a, err := lb.createAccount(ctx, fmt.Sprintf("user%d.test", i))
		if err != nil {
			return err
		}
		accounts[i] = a
	}
	writersAccts, burstAccts, probeAcct := accounts[:c.o.clients], accounts[c.o.clients:c.o.clients+3], accounts[c.o.clients+3]
	streams := make([]*stream, len(c.nodes))
	sctx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	for i, n := range c.nodes {
		streams[i] = newStream(n)
		go streams[i].run(sctx)
	}
	v := newVerifier(fmt.Sprintf("http://localhost:%d", c.port(portHAProxy)))
	log := newAckLog()
	check := func(phase string) error { return c.verifyAll(ctx, phase, direct, streams, v, log) }

	if err := checkBlobsAndSessions(ctx, lb, direct, accounts[0]); err != nil {
		c.fail("blobs and sessions: %v", err)
	} else {
		c.logf("a blob uploaded through the balancer is served by every node; a session made on one works on the others")
	}
	c.throughput(ctx, writersAccts, log)
	if err := check("throughput"); err != nil {
		return err
	}
	if c.o.only == "throughput" {
		c.summary(start)
		return c.failed()
	}
	c.burst(ctx, lb, burstAccts)
	if err := check("burst"); err != nil {
		return err
	}
	if err := c.killNode(ctx, lb, writersAccts, probeAcct, streams, log); err != nil {
		return err
	}
	if err := check("kill -9"); err != nil {
		return err
	}
	if err := c.freezeLeader(ctx, writersAccts, probeAcct, streams, log); err != nil {
		return err
	}
	if err := check("frozen leader"); err != nil {
		return err
	}
	if err := c.failoverPhase(ctx, lb, writersAccts, probeAcct, streams, log); err != nil {
		return err
	}
	if err := check("failover"); err != nil {
		return err
	}
	more, err := c.pgbouncer(ctx, sctx, probeAcct, log)
	if err != nil {
		return err
	}
	if more != nil {
		streams = append(streams, more)
		direct = c.nodeClients(30 * time.Second)
		if err := check("PgBouncer"); err != nil {
			return err
		}
	}
	c.summary(start)
	return c.failed()
}

// summary prints the figures measured.
func (c *cluster) summary(start time.Time) {
	c.logf("done in %s", time.Since(start).Round(time.Second))
	fmt.Fprintln(c.out, "\nFigures (2 vCPU machine shared with other work; every component on it):")
	for _, line := range c.report {
		fmt.Fprintln(c.out, "  "+line)
	}
}

// failed is the failed checks, if any.
func (c *cluster) failed() error {
	if len(c.failures) > 0 {
		return fmt.Errorf("%d checks failed:\n  %s", len(c.failures), strings.Join(c.failures, "\n  "))
	}
	return nil
}

// setup starts Postgres and its standby, SeaweedFS, three nodes and
// HAProxy.
func (c *cluster) setup(ctx context.Context) error {
	c.logf("work directory %s", c.work)
	if err := c.setupPostgres(ctx); err != nil {
		return err
	}
	c.logf("Postgres primary :%d with a synchronous standby :%d", c.primary.port, c.standby.port)
	if err := c.startWeed(ctx); err != nil {
		return err
	}
	c.logf("SeaweedFS S3 gateway :%d, bucket %s", c.port(portS3), s3Bucket)
	for i := range 3 {
		n := c.newNode(i)
		if c.o.nodeCPU > 0 {
			g, err := newCPUCgroup(fmt.Sprintf("bulwark-cluster-%d-%s", c.o.basePort, n.name), c.o.nodeCPU)
			if err != nil {
				return fmt.Errorf("--node-cpu: %w", err)
			}
			c.cgroups = append(c.cgroups, g)
			n.cpu = g
		}
		c.nodes = append(c.nodes, n)
		if err := c.startNode(n, c.multiHostURL()); err != nil {
			return err
		}
	}
	c.logf("three nodes on one database: %s", c.multiHostURL())
	if c.o.nodeCPU > 0 {
		c.logf("each node limited to %.2f of a core (its own cgroup)", c.o.nodeCPU)
	}
	if err := c.startHAProxy(c.nodes); err != nil {
		return err
	}
	c.logf("HAProxy round robin on %s", c.lbURL())
	return nil
}

func (c *cluster) nodeClients(timeout time.Duration) []*client {
	out := make([]*client, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, newClient(n.url(), timeout))
	}
	return out
}

// throughput writes --writes posts with --clients writers (each on its own
// account), --rounds times three ways, all through HAProxy: to one node;
// round robin over three; each account kept on one node of three (HAProxy
// hashing on the Authorization header, as docs/SCALING.md configures it).
// It reports writes/s, the share of commits rebuilt because another node
// had moved the repository, and what each commit cost.
func (c *cluster) throughput(ctx context.Context, accts []*account, log *ackLog) {
	kinds := []struct {
		name string
		port int
	}{
		{"one node", portHAProxyOne},
		{"round robin over three nodes", portHAProxy},
		{"each account on one node of three (hash on Authorization)", portHAProxyHash},
	}
	for round := range c.o.rounds {
		for _, k := range kinds {
			name := k.name
			if round > 0 {
				name += fmt.Sprintf(" (round %d)", round+1)
			}
			lb := newClient(fmt.Sprintf("http://127.0.0.1:%d", c.port(k.port)), 30*time.Second)
			clients := c.clientsOf(lb, 30*time.Second)
			var waitProfiles, writeStatements func()
			if c.o.profileDir != "" {
				writeStatements = c.statements(ctx, c.o.profileDir, name)
				waitProfiles = c.profile(c.o.profileDir, name, c.o.profileSeconds)
			}
			before := c.usage(ctx)
			_, errsBefore := log.snapshot()
			load := loadAverage()
			took := writers(ctx, clients, accts, c.o.writes, log)
			cost := c.usage(ctx).minus(before)
			cost.load = (load + loadAverage()) / 2
			if waitProfiles != nil {
				waitProfiles()
				writeStatements()
			}
			_, errs := log.snapshot()
			failed := 0
			for k, n := range errs {
				failed += n - errsBefore[k]
			}
			redo := 0.0
			if cost.commits > 0 {
				redo = 100 * cost.stale / cost.commits
			}
			c.figure("%s: %d writes from %d clients in %.1f s = %.0f writes/s; rebuilt %.1f%% (caught up %.0f), failed %d; %s",
				name, c.o.writes, c.o.clients, took.Seconds(), float64(c.o.writes)/took.Seconds(), redo, cost.refreshes, failed, cost)
			if c.o.hints && k.port == portHAProxy && cost.hinted == 0 {
				c.fail("%s: no node caught a cached tree up from another node's commit hint", name)
			}
		}
	}
}

// burst writes --burst posts without a record key, three clients on each
// of three accounts through the balancer: several nodes creating records
// in one repository at once must never pick the same key.
func (c *cluster) burst(ctx context.Context, lb *client, accts []*account) {
	log := newAckLog()
	clients := make([]*client, 9)
	for i := range clients {
		clients[i] = lb
	}
	took := writers(ctx, clients, accts, c.o.burst, log)
	acks, errs := log.snapshot()
	c.figure("burst: %d writes without a record key, 3 clients on each of 3 accounts round robin, in %.1f s; errors %v",
		len(acks), took.Seconds(), errs)
	for k, n := range errs {
		if strings.Contains(k, "already exists") {
			c.fail("burst: %d writes refused: %s", n, k)
		}
	}
}

// underLoad starts writers on accts through clients and a probe writing to
// probeAcct through the node at probeURL every interval, each write
// recorded in log. end stops both and waits for them (it may be called
// again).
func (c *cluster) underLoad(ctx context.Context, clients []*client, accts []*account, probeURL string, probeAcct *account, every time.Duration, log *ackLog) (pr *probe, end func()) {
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); writers(wctx, clients, accts, 0, log) }()
	pr = &probe{}
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		pr.run(wctx, newClient(probeURL, 5*time.Second), probeAcct, every, log)
	}()
	var once sync.Once
	return pr, func() { once.Do(func() { stop(); <-done; <-probed }) }
}

// killNode kills the sequencer's leader with SIGKILL under write load and
// starts it again.
func (c *cluster) killNode(ctx context.Context, lb *client, accts []*account, probeAcct *account, streams []*stream, log *ackLog) error {
	victim, err := c.leader(ctx)
	if err != nil {
		return err
	}
	pr, end := c.underLoad(ctx, c.clientsOf(lb, 5*time.Second), accts, c.other(victim).url(), probeAcct, 100*time.Millisecond, log)
	defer end()
	time.Sleep(2 * time.Second)
	killed := time.Now()
	c.logf("kill -9 %s (the sequencer's leader)", victim.name)
	victim.p.stop(syscall.SIGKILL, time.Second)
	time.Sleep(6 * time.Second)
	if err := c.startNode(victim, c.multiHostURL()); err != nil {
		return err
	}
	c.logf("%s restarted", victim.name)
	time.Sleep(2 * time.Second)
	end()
	c.stallFigure("kill -9 of the leader", pr, streams, victim, killed)
	return nil
}

// freezeLeader stops the sequencer's leader with SIGSTOP for --freeze
// under write load, and measures how long events committed through the
// other nodes took to reach their firehoses.
func (c *cluster) freezeLeader(ctx context.Context, accts []*account, probeAcct *account, streams []*stream, log *ackLog) error {
	victim, err := c.leader(ctx)
	if err != nil {
		return err
	}
	lb := newClient(c.lbURL(), 3*time.Second)
	pr, end := c.underLoad(ctx, c.clientsOf(lb, 3*time.Second), accts, c.other(victim).url(), probeAcct, 100*time.Millisecond, log)
	defer end()
	time.Sleep(2 * time.Second)
	c.logf("SIGSTOP %s (the sequencer's leader) for %s", victim.name, c.o.freeze)
	frozen := time.Now()
	if err := victim.p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	time.Sleep(c.o.freeze)
	if err := victim.p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	c.logf("SIGCONT %s", victim.name)
	time.Sleep(3 * time.Second)
	end()
	worst := c.stallFigure(fmt.Sprintf("leader frozen for %s", c.o.freeze), pr, streams, victim, frozen)
	if worst > leaseBound {
		c.fail("a frozen leader stalled another node's firehose for %s, over the %s bound", worst.Round(10*time.Millisecond), leaseBound)
	}
	return nil
}

// failoverPhase stops the primary and promotes the standby under write
// load, and measures the write outage.
func (c *cluster) failoverPhase(ctx context.Context, lb *client, accts []*account, probeAcct *account, streams []*stream, log *ackLog) error {
	pr, end := c.underLoad(ctx, c.clientsOf(lb, 5*time.Second), accts, c.nodes[0].url(), probeAcct, 50*time.Millisecond, log)
	defer end()
	time.Sleep(2 * time.Second)
	c.logf("stopping the primary, promoting the standby")
	stopped, promoted, err := c.failover(ctx)
	if err != nil {
		return err
	}
	c.currentPrimary = c.standby
	time.Sleep(6 * time.Second)
	end()
	var first time.Time
	_, acked := pr.ackTimes()
	for _, at := range acked {
		if at.After(stopped) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	if first.IsZero() {
		c.fail("failover: no write acknowledged after the promotion")
		return nil
	}
	c.figure("failover: primary stopped, standby promoted %.2f s later; first write acknowledged %.2f s after the stop (%.2f s after the promotion)",
		promoted.Sub(stopped).Seconds(), first.Sub(stopped).Seconds(), first.Sub(promoted).Seconds())
	c.stallFigure("failover", pr, streams, nil, stopped)
	return nil
}

// pgbouncer starts PgBouncer (transaction mode) in front of the primary;
// a fourth node through it without a direct URL must refuse to start,
// with one it must work. It returns the fourth node's firehose.
func (c *cluster) pgbouncer(ctx, sctx context.Context, probeAcct *account, log *ackLog) (*stream, error) {
	pg := c.primary
	if c.currentPrimary != nil {
		pg = c.currentPrimary
	}
	port, err := c.startPgBouncer(pg)
	if err != nil {
		return nil, err
	}
	pooled := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/bulwark?sslmode=disable", port)
	n := c.newNode(3)
	out, err := c.refusedNode(n, pooled)
	if err != nil {
		c.fail("PgBouncer: %v", err)
	} else if !strings.Contains(out, "BULWARK_DATABASE_DIRECT_URL") {
		c.fail("PgBouncer: the refusal does not say what to set: %s", out)
	} else {
		c.logf("behind PgBouncer in transaction mode without a direct URL, a node refuses to start and names BULWARK_DATABASE_DIRECT_URL")
	}
	n.extra = []string{"--database-direct-url", c.multiHostURL()}
	if err := c.startNode(n, pooled); err != nil {
		return nil, err
	}
	c.nodes = append(c.nodes, n)
	s := newStream(n)
	go s.run(sctx)
	cl := newClient(n.url(), 10*time.Second)
	for i := range 50 {
		if err := cl.createPost(ctx, probeAcct, fmt.Sprint("through PgBouncer ", i), log); err != nil {
			c.fail("PgBouncer: a write through the fourth node: %v", err)
			break
		}
	}
	c.logf("a fourth node through PgBouncer (with a direct URL beside it) took 50 writes")
	return s, nil
}

// clientsOf is --clients clients of cl's base with timeout.
func (c *cluster) clientsOf(cl *client, timeout time.Duration) []*client {
	out := make([]*client, c.o.clients)
	for i := range out {
		out[i] = newClient(cl.base, timeout)
	}
	return out
}

// other is a running node that is not n.
func (c *cluster) other(n *node) *node {
	for _, o := range c.nodes {
		if o != n && o.p != nil && o.p.running() {
			return o
		}
	}
	return c.nodes[0]
}

// stallFigure reports, for the probe's writes acknowledged after since,
// the longest time one took to reach each firehose (but that of the node
// struck), and returns the worst.
func (c *cluster) stallFigure(what string, pr *probe, streams []*stream, struck *node, since time.Time) time.Duration {
	var worst time.Duration
	var per []string
	for _, s := range streams {
		if s.node == struck {
			continue
		}
		var longest time.Duration
		did, acks := pr.ackTimes()
		for rev, acked := range acks {
			if acked.Before(since) {
				continue
			}
			at, ok := s.arrival(did, rev)
			if !ok {
				continue
			}
			longest = max(longest, at.Sub(acked))
		}
		worst = max(worst, longest)
		per = append(per, fmt.Sprintf("%s %.2f s", s.node.name, longest.Seconds()))
	}
	slices.Sort(per)
	c.figure("%s: longest a write took from its acknowledgement to a firehose: %s", what, strings.Join(per, ", "))
	return worst
}

// verifyAll waits until every event is sequenced and every stream has it,
// then checks the streams and the acknowledged writes.
func (c *cluster) verifyAll(ctx context.Context, phase string, direct []*client, streams []*stream, v *verifier, log *ackLog) error {
	var last int64
	err := waitFor(nil, 2*time.Minute, phase+": every event sequenced and on every firehose", func() bool {
		pending, l, err := c.sequencerState(ctx)
		if err != nil || pending > 0 {
			return false
		}
		last = l
		for _, s := range streams {
			if s.lastSeq() < l {
				return false
			}
		}
		return true
	})
	if err != nil {
		for _, s := range streams {
			c.logf("%s: stream at seq %d", s.node.name, s.lastSeq())
		}
		return err
	}
	rep := checkStreams(streams, last, v.verify)
	for _, p := range rep.problems {
		c.fail("%s: %s", phase, p)
	}
	acks, errs := log.snapshot()
	lost, problems := checkAcked(ctx, direct, streams[0], acks)
	for _, p := range problems {
		c.fail("%s: %s", phase, p)
	}
	if lost > 0 {
		c.fail("%s: %d acknowledged writes are missing", phase, lost)
	}
	c.logf("%s: %d acknowledged writes all present, getRepo identical from %d nodes; %d firehoses identical and gapless to seq %d, %d #commits verified; failed writes so far %v",
		phase, len(acks), len(direct), len(streams), last, rep.verified, errs)
	if len(rep.ends) > 0 {
		c.logf("%s: connections ended by error frames so far (each stream resumed from its last seq): %v", phase, rep.ends)
	}
	if len(rep.problems) > 0 || lost > 0 {
		return errors.New(phase + ": checks failed (see above)")
	}
	return nil
}
