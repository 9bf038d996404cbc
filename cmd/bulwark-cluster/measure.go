package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// What a throughput run cost, beside its rate: the CPU each component
// used (from /proc, so it includes what exited meanwhile) and what
// Postgres ran, per commit. Every component shares the machine's cores,
// so CPU per commit compares runs where writes/s alone would mix in the
// other work on the machine.

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
// every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// usage is a snapshot of the components' CPU and of Postgres's counters.
type usage struct {
	at                             time.Time
	nodes, primary, standby, proxy time.Duration
	// tryCalls and commitCalls are the calls of bulwark_try_commit and
	// bulwark_commit (pg_stat_user_functions, track_functions = pl);
	// xacts the transactions committed in the database.
	tryCalls, commitCalls, xacts float64
	c                            counters
}

func (c *cluster) usage(ctx context.Context) usage {
	u := usage{at: time.Now(), c: c.counters()}
	procs := readProcs()
	for _, n := range c.nodes {
		if n.p != nil && n.p.running() {
			u.nodes += procs.treeCPU(n.p.cmd.Process.Pid)
		}
	}
	if c.primary != nil && c.primary.p != nil {
		u.primary = procs.treeCPU(c.primary.p.cmd.Process.Pid)
	}
	if c.standby != nil && c.standby.p != nil {
		u.standby = procs.treeCPU(c.standby.p.cmd.Process.Pid)
	}
	if c.haproxy != nil {
		u.proxy = procs.treeCPU(c.haproxy.cmd.Process.Pid)
	}
	pg := c.primary
	if c.currentPrimary != nil {
		pg = c.currentPrimary
	}
	conn, err := pgx.Connect(ctx, pg.url("bulwark"))
	if err != nil {
		return u
	}
	defer conn.Close(ctx)
	_ = conn.QueryRow(ctx, `SELECT
		coalesce((SELECT sum(calls) FROM pg_stat_user_functions WHERE funcname = 'bulwark_try_commit'), 0),
		coalesce((SELECT sum(calls) FROM pg_stat_user_functions WHERE funcname = 'bulwark_commit'), 0),
		(SELECT xact_commit FROM pg_stat_database WHERE datname = 'bulwark')`).
		Scan(&u.tryCalls, &u.commitCalls, &u.xacts)
	return u
}

// runCost is what a run cost per commit.
type runCost struct {
	commits                           float64
	nodeCPU, pgCPU, sbCPU, proxyCPU   time.Duration // per commit
	calls, checks, xacts, stale, load float64       // per commit, but load
	plans, refreshes, hinted          float64
}

func (a usage) minus(b usage) runCost {
	d := a.c.minus(b.c)
	r := runCost{commits: d.commits, stale: d.stale, refreshes: d.refreshes, plans: d.plans, hinted: d.hinted}
	if d.commits <= 0 {
		return r
	}
	per := func(x time.Duration) time.Duration { return time.Duration(float64(x) / d.commits) }
	r.nodeCPU, r.pgCPU, r.sbCPU, r.proxyCPU = per(a.nodes-b.nodes), per(a.primary-b.primary), per(a.standby-b.standby), per(a.proxy-b.proxy)
	r.calls = (a.tryCalls - b.tryCalls + a.commitCalls - b.commitCalls) / d.commits
	r.checks = d.checks / d.commits
	r.xacts = (a.xacts - b.xacts) / d.commits
	return r
}

func (r runCost) String() string {
	plans := 0.0
	if r.commits > 0 {
		plans = r.plans / r.commits
	}
	hinted := 0.0
	if r.commits > 0 {
		hinted = r.hinted / r.commits
	}
	return fmt.Sprintf("per commit: CPU nodes %d µs, Postgres %d µs (standby %d µs), HAProxy %d µs; plans %.2f, commit calls %.2f, root checks %.2f, caught up from hints %.2f, transactions %.2f; load %.1f",
		r.nodeCPU.Microseconds(), r.pgCPU.Microseconds(), r.sbCPU.Microseconds(), r.proxyCPU.Microseconds(), plans, r.calls, r.checks, hinted, r.xacts, r.load)
}

// loadAverage is the one-minute load average.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// procTable is every process's parent and CPU time.
type procTable struct {
	parent map[int]int
	cpu    map[int]time.Duration
}

func readProcs() procTable {
	t := procTable{parent: map[int]int{}, cpu: map[int]time.Duration{}}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command may hold spaces: the fields start after its ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 15 {
			continue
		}
		// f[0] is field 3 (state): ppid is field 4, utime..cstime 14-17.
		ppid, _ := strconv.Atoi(f[1])
		var ticks int64
		for _, k := range f[11:15] {
			v, _ := strconv.ParseInt(k, 10, 64)
			ticks += v
		}
		t.parent[pid] = ppid
		t.cpu[pid] = time.Duration(ticks) * clockTick
	}
	return t
}

// treeCPU is the CPU of pid and its live descendants, with what their
// reaped children used (cutime, cstime): a live process's counts hold
// only children that are gone, so nothing is counted twice.
func (t procTable) treeCPU(pid int) time.Duration {
	var total time.Duration
	for p, cpu := range t.cpu {
		for q := p; q > 1; q = t.parent[q] {
			if q == pid {
				total += cpu
				break
			}
		}
	}
	return total
}

// profile fetches a CPU profile of every node for the next seconds into
// dir, named after the run; it returns at once and wait waits for them.
func (c *cluster) profile(dir, run string, seconds int) (wait func()) {
	var wg sync.WaitGroup
	name := fileName(run)
	for _, n := range c.nodes {
		if n.p == nil || !n.p.running() {
			continue
		}
		wg.Go(func() {
			url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", n.metricsPort, seconds)
			resp, err := http.Get(url)
			if err != nil {
				c.logf("profile of %s: %v", n.name, err)
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(filepath.Join(dir, name+"-"+n.name+".pprof"))
			if err != nil {
				c.logf("profile of %s: %v", n.name, err)
				return
			}
			defer f.Close()
			_, _ = io.Copy(f, resp.Body)
		})
	}
	return wg.Wait
}

// statements resets Postgres's statement statistics and returns the
// function that writes those of the run since to dir (with --profile).
func (c *cluster) statements(ctx context.Context, dir, run string) (write func()) {
	pg := c.primary
	if c.currentPrimary != nil {
		pg = c.currentPrimary
	}
	conn, err := pgx.Connect(ctx, pg.url("bulwark"))
	if err != nil {
		return func() {}
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		c.logf("pg_stat_statements: %v", err)
		return func() {}
	}
	_, _ = conn.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return func() {
		conn, err := pgx.Connect(ctx, pg.url("bulwark"))
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, `SELECT calls, round(total_exec_time::numeric, 1), round((total_exec_time / calls * 1000)::numeric), rows, left(regexp_replace(query, '\s+', ' ', 'g'), 160)
			FROM pg_stat_statements WHERE calls > 0 ORDER BY total_exec_time DESC LIMIT 25`)
		if err != nil {
			return
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%8s %10s %8s %8s  %s\n", "calls", "total ms", "µs/call", "rows", "query")
		for rows.Next() {
			var calls, rowsN int64
			var total, per float64
			var q string
			if rows.Scan(&calls, &total, &per, &rowsN, &q) == nil {
				fmt.Fprintf(&b, "%8d %10.1f %8.0f %8d  %s\n", calls, total, per, rowsN, q)
			}
		}
		_ = os.WriteFile(filepath.Join(dir, fileName(run)+"-statements.txt"), []byte(b.String()), 0o644)
	}
}

// fileName is run as a file name.
func fileName(run string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(run))
}
