package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Each node's own CPU. On one machine the nodes, Postgres, HAProxy and the
// writers share its cores, so adding nodes adds no CPU: a run then
// measures what a commit costs, not what more machines would give. With
// --node-cpu each node gets a CPU quota of its own (a cgroup, as a
// container runtime would give it), the way separate machines of that
// size would: a node's work is bounded by its own quota, not by the
// others'.

// cpuCgroup is a cgroup that limits the CPU of the processes put in it.
type cpuCgroup struct {
	dir string
	v2  bool
}

// newCPUCgroup makes a cgroup named name limited to cores CPUs (cgroup v2
// if the machine has it, else v1's cpu controller).
func newCPUCgroup(name string, cores float64) (*cpuCgroup, error) {
	const period = 100000 // µs
	quota := int(cores * period)
	if quota < 1000 {
		return nil, fmt.Errorf("a CPU quota of %.3f cores is too small", cores)
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		g := &cpuCgroup{dir: filepath.Join("/sys/fs/cgroup", name), v2: true}
		// The cpu controller must be on for the root's children.
		_ = os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpu"), 0)
		if err := os.Mkdir(g.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		return g, os.WriteFile(filepath.Join(g.dir, "cpu.max"), fmt.Appendf(nil, "%d %d", quota, period), 0)
	}
	root := "/sys/fs/cgroup/cpu"
	if _, err := os.Stat(filepath.Join(root, "cpu.cfs_quota_us")); err != nil {
		return nil, fmt.Errorf("no cgroup CPU controller at /sys/fs/cgroup (v2) or %s (v1)", root)
	}
	g := &cpuCgroup{dir: filepath.Join(root, name)}
	if err := os.Mkdir(g.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(g.dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0); err != nil {
		return nil, err
	}
	return g, os.WriteFile(filepath.Join(g.dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(quota)), 0)
}

// add moves the process pid (all of its threads) into g.
func (g *cpuCgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// remove deletes g once its processes have exited (rmdir refuses a
// cgroup with processes left, which then does no harm).
func (g *cpuCgroup) remove() {
	_ = os.Remove(g.dir)
}
