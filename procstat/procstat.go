// Package procstat reads the fields of Linux's /proc/PID/stat (and
// /proc/PID/task/TID/stat) that Bulwark's benchmarks and load tool use:
// CPU time and nice value.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is USER_HZ, the unit of utime and stime.
const ClockTicks = 100

// Stat is one process's (or thread's) stat line, split into its fields
// after the command name (which may hold spaces and parentheses).
type Stat []string

// Read reads and splits path (a /proc/PID/stat or /proc/PID/task/TID/stat).
func Read(path string) (Stat, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(raw)
}

// Parse splits a stat line.
func Parse(raw []byte) (Stat, error) {
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return nil, fmt.Errorf("procstat: no command name in %q", raw)
	}
	// Field 3 (state) comes first; the line must reach field 19 (nice).
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 17 {
		return nil, fmt.Errorf("procstat: %d fields after the command name, want at least 17", len(f))
	}
	return Stat(f), nil
}

// field returns stat field n (numbered as in proc(5), from 3) as an int.
func (s Stat) field(n int) (int64, error) {
	v, err := strconv.ParseInt(s[n-3], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("procstat: field %d: %w", n, err)
	}
	return v, nil
}

// PPID is the parent's process ID (field 4).
func (s Stat) PPID() string { return s[1] }

// CPU is the user plus system time used (fields 14 and 15).
func (s Stat) CPU() (time.Duration, error) {
	ut, err := s.field(14)
	if err != nil {
		return 0, err
	}
	st, err := s.field(15)
	if err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * (time.Second / ClockTicks), nil
}

// Nice is the nice value (field 19).
func (s Stat) Nice() (int, error) {
	n, err := s.field(19)
	return int(n), err
}
