package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// attackRole is the hidden first argument that makes this binary the
// attack child of --attack-nice: it runs the attack scenarios it is given
// for --duration and prints an attackReport as JSON on stdout.
const attackRole = "__attack"

// inAttackChild is set in the attack child's environment: a child never
// starts another (whatever flags or BULWARK_LOAD_* variables it inherits).
const inAttackChild = "BULWARK_LOAD_IN_ATTACK_CHILD"

// attackNice is --attack-nice: unset, or a nice value 0-19.
type attackNice struct {
	set  bool
	nice int
}

func (a *attackNice) String() string {
	if a == nil || !a.set {
		return ""
	}
	return strconv.Itoa(a.nice)
}

func (a *attackNice) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n > 19 {
		return fmt.Errorf("%q: want a nice value 0-19", s)
	}
	a.set, a.nice = true, n
	return nil
}

// attackReport is what the attack child hands back.
type attackReport struct {
	PID int `json:"pid"`
	// ThreadNice is the nice value of each of its threads at the end.
	ThreadNice []int `json:"thread_nice"`
	// CPUSeconds is the CPU the child used over WallSeconds.
	CPUSeconds  float64          `json:"cpu_seconds"`
	WallSeconds float64          `json:"wall_seconds"`
	Interrupted bool             `json:"interrupted"`
	Recorders   []recorderReport `json:"recorders"`
}

// attackChild is a running attack process.
type attackChild struct {
	ctx    context.Context
	cmd    *exec.Cmd
	stdout bytes.Buffer
}

// attackArgs are the child's arguments: the attack flags of o, spelled out
// so that the child does not depend on the parent's environment for them.
func attackArgs(o options, attacks []string) []string {
	return []string{attackRole,
		"--url", o.url,
		"--duration", o.duration.String(),
		"--scenarios", strings.Join(attacks, ","),
		"--flood-conns", strconv.Itoa(o.floodConns),
		"--relays", strconv.Itoa(o.relays),
		"--cursor", strconv.FormatInt(o.cursor, 10),
		"--scrapers", strconv.Itoa(o.scrapers),
		"--source-addrs", o.sourceAddrs,
		"--did", o.did,
		"--blob-cids", o.blobCIDs,
		"--honor-retry-after=" + strconv.FormatBool(o.honorRetryAfter),
	}
}

// startAttackChild starts this binary as the attack child at nice
// o.attack. Interrupting ctx interrupts the child, which still
// reports what it did.
func startAttackChild(ctx context.Context, o options, attacks []string, logger *slog.Logger) (*attackChild, error) {
	if os.Getenv(inAttackChild) != "" {
		return nil, errors.New("the attack process does not start another")
	}
	exe := o.selfExe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find this executable: %w", err)
		}
	}
	c := &attackChild{ctx: ctx}
	cmd := exec.CommandContext(ctx, exe, attackArgs(o, attacks)...)
	cmd.Env = append(append(os.Environ(), o.childEnv...), inAttackChild+"=1")
	cmd.Stdout = &c.stdout
	cmd.Stderr = o.childStderr
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	if err := startNiced(cmd, o.attack.nice); err != nil {
		return nil, err
	}
	c.cmd = cmd
	logger.Info("attack process started", "pid", cmd.Process.Pid, "nice", o.attack.nice, "scenarios", strings.Join(attacks, ","))
	return c, nil
}

// wait waits for the child to finish and returns its report.
func (c *attackChild) wait() (*attackReport, error) {
	err := c.cmd.Wait()
	var rep attackReport
	derr := json.Unmarshal(c.stdout.Bytes(), &rep)
	switch {
	case derr == nil && (err == nil || c.ctx.Err() != nil):
		// Interrupted with us, it still reported.
		return &rep, nil
	case err != nil:
		return nil, fmt.Errorf("attack process: %w", err)
	default:
		return nil, fmt.Errorf("attack process report: %w", derr)
	}
}

// runAttackChild is the child's main: the attack scenarios of args, then
// the report on stdout.
func runAttackChild(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := newFlagSet(&o, stderr)
	if code, ok := parseFlags(fs, "bulwark-load attack", args, stderr); !ok {
		return code
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil)).With("process", "attack")
	rep, err := attack(ctx, o, logger)
	if err != nil {
		fmt.Fprintln(stderr, "bulwark-load attack:", err)
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(rep); err != nil {
		fmt.Fprintln(stderr, "bulwark-load attack:", err)
		return 1
	}
	return 0
}

// attack runs the attack scenarios of o (never the writer) for
// o.duration.
func attack(ctx context.Context, o options, logger *slog.Logger) (*attackReport, error) {
	o.handle, o.password = "", "" // the writer stays in the parent
	p, err := parsePlan(o, logger)
	if err != nil {
		return nil, err
	}
	delete(p.want, "write")
	recs := map[string]*recorder{}
	for _, name := range attackScenarios {
		recs[name] = newRecorder(name)
	}
	mark := cpuClock()
	lctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var wg sync.WaitGroup
	startAttacks(lctx, &wg, o, p, recs)
	go progress(lctx, logger, recs)
	wg.Wait()
	use := mark.since()
	rep := &attackReport{
		PID: os.Getpid(), CPUSeconds: use.seconds, WallSeconds: use.wall,
		Interrupted: ctx.Err() != nil,
	}
	rep.ThreadNice, _ = threadNice(os.Getpid())
	for _, name := range p.attacks() {
		rep.Recorders = append(rep.Recorders, recs[name].report(name))
	}
	return rep, nil
}

// printLoadToolCPU says how much CPU the load tool took during the load:
// what it took is what the server did not get on a shared machine.
func printLoadToolCPU(w io.Writer, self cpuUse, split bool, rep *attackReport) {
	if !self.ok {
		return
	}
	if !split {
		fmt.Fprintf(w, "load tool CPU under load: %.2f cores (one process: writer, sampler and attacks)\n", self.cores())
		return
	}
	fmt.Fprintf(w, "load tool CPU under load: writer and sampler %.2f cores", self.cores())
	if rep != nil {
		cores := 0.0
		if rep.WallSeconds > 0 {
			cores = rep.CPUSeconds / rep.WallSeconds
		}
		fmt.Fprintf(w, "; attack process (pid %d) %.2f cores at nice %s", rep.PID, cores, niceSummary(rep.ThreadNice))
	}
	fmt.Fprintln(w)
}

// niceSummary is "19 (all 12 threads)", or the values when they differ.
func niceSummary(nice []int) string {
	if len(nice) == 0 {
		return "unknown"
	}
	distinct := slices.Compact(slices.Sorted(slices.Values(nice)))
	if len(distinct) == 1 {
		return fmt.Sprintf("%d (all %d threads)", distinct[0], len(nice))
	}
	return fmt.Sprintf("%v (threads differ!)", nice)
}
