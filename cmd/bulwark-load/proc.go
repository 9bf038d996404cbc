package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat.
// It is 100 on every Linux architecture Go supports.
const clockTicks = 100

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
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces; fields after it are
	// counted from the closing parenthesis.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: bad cpu times", pid)
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
	return float64(utime+stime) / clockTicks, rss, nil
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
