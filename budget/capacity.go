package budget

import (
	"bufio"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// Bounds of the default capacity.
const (
	// MaxDefaultCapacity caps the memory-derived default: beyond 1 GiB of
	// responses in flight the bottleneck is the network or Postgres, and
	// the rest of the memory is better left to the page cache.
	MaxDefaultCapacity = 1 << 30
	// MinDefaultCapacity keeps a tiny container from getting a budget too
	// small to serve one ordinary record.
	MinDefaultCapacity = 16 << 20
	// fallbackMemory is assumed when no memory size can be read.
	fallbackMemory = 1 << 30
)

// Files the default capacity is read from (variables for tests).
var (
	cgroupV2MemoryMax = "/sys/fs/cgroup/memory.max"
	cgroupV1MemoryMax = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	procMeminfo       = "/proc/meminfo"
)

// DefaultCapacity is the capacity of a Budget with a zero Config: a quarter
// of the smallest memory bound that applies to this process (the cgroup
// limit, GOMEMLIMIT, the machine's total memory), clamped to
// [MinDefaultCapacity, MaxDefaultCapacity]. A quarter leaves room for the
// baseline heap (caches, connections) and the Go runtime's GC headroom:
// the server lets the heap grow to five times the live data, but sets a
// soft memory limit at half of memory (config.ApplyGC), so with
// a full budget the collector works harder rather than the heap growing.
func DefaultCapacity() int64 {
	return capacityFrom(MemoryLimit())
}

func capacityFrom(mem int64) int64 {
	return min(max(mem/4, MinDefaultCapacity), MaxDefaultCapacity)
}

// MemoryLimit returns the smallest memory bound that applies to this
// process: the cgroup (v2 or v1) limit, GOMEMLIMIT if set, and MemTotal
// from /proc/meminfo. When none can be read it returns 1 GiB.
func MemoryLimit() int64 {
	limit := int64(math.MaxInt64)
	if v, ok := readCgroupLimit(cgroupV2MemoryMax); ok {
		limit = min(limit, v)
	}
	if v, ok := readCgroupLimit(cgroupV1MemoryMax); ok {
		limit = min(limit, v)
	}
	// SetMemoryLimit(-1) reads the limit without changing it; MaxInt64
	// means unset.
	if v := debug.SetMemoryLimit(-1); v > 0 && v < math.MaxInt64 {
		limit = min(limit, v)
	}
	if f, err := os.Open(procMeminfo); err == nil {
		v, ok := parseMemTotal(f)
		_ = f.Close()
		if ok {
			limit = min(limit, v)
		}
	}
	if limit == math.MaxInt64 {
		return fallbackMemory
	}
	return limit
}

// readCgroupLimit reads a cgroup memory limit file. "max" (v2) and the
// huge page-aligned number v1 uses for "no limit" both mean no limit.
func readCgroupLimit(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parseCgroupLimit(string(b))
}

func parseCgroupLimit(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	if s == "" || s == "max" {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	// cgroup v1 reports "unlimited" as about 2^63 rounded to a page.
	if err != nil || v <= 0 || v >= 1<<62 {
		return 0, false
	}
	return v, true
}

// parseMemTotal finds "MemTotal: N kB" in /proc/meminfo's format.
func parseMemTotal(r interface{ Read([]byte) (int, error) }) (int64, bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "MemTotal:" {
			continue
		}
		v, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil || v <= 0 {
			return 0, false
		}
		if len(fields) >= 3 && fields[2] == "kB" {
			v *= 1024
		}
		return v, true
	}
	return 0, false
}
