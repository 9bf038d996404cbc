package config

import (
	"os"
	"runtime/debug"
	"runtime/metrics"

	"github.com/bulwark-pds/bulwark/budget"
)

// DefaultGCPercent is the Go garbage collector's target (GOGC) the server
// runs with. A PDS keeps little live heap (caches, connections) and
// allocates fast per request, so at Go's default of 100 it collects every
// few dozen commits; at 400 it collects a quarter as often, for 3-11% more
// commits a second at one and at 16 writers (docs/BENCHMARKS.md). The
// price is headroom: under the incident replay's scraper fleet the
// process peaked at ~235 MB instead of ~118 MB (64 MiB in-flight budget).
// The memory limit ApplyGC sets alongside bounds that headroom, so it
// never costs an out-of-memory kill.
const DefaultGCPercent = 400

// ApplyGC makes this process's garbage collector run as the server's does:
// target percent (-1 turns the proportional collector off), and a soft
// memory limit of half the memory the process may use (budget.MemoryLimit;
// the other half is left to the managed Postgres and the page cache): near
// it the collector runs as often as it must, whatever the target. GOGC and
// GOMEMLIMIT set in the environment win over each. It returns the target
// and limit in force.
func ApplyGC(percent int) (gcPercent int, memoryLimit int64) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(percent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(budget.MemoryLimit() / 2)
	}
	in := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(in)
	return int(in[0].Value.Uint64()), int64(in[1].Value.Uint64())
}
