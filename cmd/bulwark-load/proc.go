package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bulwark-pds/bulwark/procstat"
)

// procSampler samples a server process's CPU and RSS from /proc once a
// second and keeps the figures per phase (idle, load, cooldown).
type procSampler struct {
	pid int

	mu     sync.Mutex
	phase  string
	phases []string
	stats  map[string]*procPhase
	err    error
}

type procPhase struct {
	samples         int
	rssMax, rssLast int64
	rssFirst        int64
	cpuStart        float64 // seconds of CPU at the phase's first sample
	cpuEnd          float64
	wallStart       time.Time
	wallEnd         time.Time
}

func newProcSampler(pid int) *procSampler {
	return &procSampler{pid: pid, stats: map[string]*procPhase{}}
}

// setPhase starts attributing samples to phase, taking one at once.
func (p *procSampler) setPhase(phase string) {
	p.mu.Lock()
	p.phase = phase
	if _, ok := p.stats[phase]; !ok {
		p.stats[phase] = &procPhase{}
		p.phases = append(p.phases, phase)
	}
	p.mu.Unlock()
	p.sample()
}

func (p *procSampler) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.sample()
		}
	}
}

func (p *procSampler) sample() {
	cpu, rss, err := readProc(p.pid)
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.err = err
		return
	}
	s := p.stats[p.phase]
	if s == nil {
		return
	}
	if s.samples == 0 {
		s.cpuStart, s.wallStart, s.rssFirst = cpu, now, rss
	}
	s.samples++
	s.cpuEnd, s.wallEnd, s.rssLast = cpu, now, rss
	s.rssMax = max(s.rssMax, rss)
}

// readProc returns the process's CPU seconds (user + system) and resident
// set size in bytes.
func readProc(pid int) (cpu float64, rss int64, err error) {
	st, err := procstat.Read(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	used, err := st.CPU()
	if err != nil {
		return 0, 0, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return 0, 0, fmt.Errorf("/proc/%d/status: bad VmRSS", pid)
				}
				rss = kb * 1024
			}
		}
	}
	return used.Seconds(), rss, nil
}

// summary describes each phase: RSS at its start, maximum and end, and the
// CPU used (in cores: 1.0 is one core busy).
func (p *procSampler) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "server pid %d:\n", p.pid)
	for _, name := range p.phases {
		s := p.stats[name]
		if s.samples == 0 {
			continue
		}
		cores := 0.0
		if wall := s.wallEnd.Sub(s.wallStart).Seconds(); wall > 0 {
			cores = (s.cpuEnd - s.cpuStart) / wall
		}
		fmt.Fprintf(&b, "  %-9s RSS start %6.1f MB, max %6.1f MB, end %6.1f MB; CPU %.2f cores (%d samples)\n",
			name, mb(s.rssFirst), mb(s.rssMax), mb(s.rssLast), cores, s.samples)
	}
	if p.err != nil {
		fmt.Fprintf(&b, "  last sampling error: %v\n", p.err)
	}
	return b.String()
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

// cpuMark is this process's CPU time at an instant, to measure what the
// load tool itself uses.
type cpuMark struct {
	cpu float64
	at  time.Time
	err error
}

func cpuClock() cpuMark {
	cpu, _, err := readProc(os.Getpid())
	return cpuMark{cpu: cpu, at: time.Now(), err: err}
}

// cpuUse is CPU seconds used over wall seconds.
type cpuUse struct {
	seconds, wall float64
	ok            bool
}

func (m cpuMark) since() cpuUse {
	now := cpuClock()
	if m.err != nil || now.err != nil {
		return cpuUse{}
	}
	return cpuUse{seconds: now.cpu - m.cpu, wall: now.at.Sub(m.at).Seconds(), ok: true}
}

// cores is the average number of cores busy.
func (u cpuUse) cores() float64 {
	if u.wall <= 0 {
		return 0
	}
	return u.seconds / u.wall
}

// threadNice returns the nice value of each of pid's threads (field 19 of
// /proc/PID/task/TID/stat): on Linux the nice value is a thread's, so a
// process is only as low-priority as its least nice thread.
func threadNice(pid int) ([]int, error) {
	stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, path := range stats {
		n, err := taskNice(path)
		if errors.Is(err, errThreadGone) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no threads found for pid %d", pid)
	}
	return out, nil
}

// errThreadGone is taskNice's error for a thread that has ended.
var errThreadGone = errors.New("thread ended")

// taskNice reads the nice value (field 19) of a /proc/PID/task/TID/stat.
func taskNice(path string) (int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errThreadGone, err)
	}
	st, err := procstat.Parse(raw)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return st.Nice()
}
