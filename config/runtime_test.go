package config

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/budget"
)

func TestGCPercentSetting(t *testing.T) {
	t.Parallel()
	c, err := parse(t, nil)
	require.NoError(t, err)
	require.Equal(t, DefaultGCPercent, c.GCPercent)

	c, err = parse(t, map[string]string{"BULWARK_GC_PERCENT": "150"})
	require.NoError(t, err)
	require.Equal(t, 150, c.GCPercent)

	c, err = parse(t, nil, "--gc-percent", "-1")
	require.NoError(t, err)
	require.Equal(t, -1, c.GCPercent)

	for _, bad := range []string{"0", "9", "-2"} {
		_, err = parse(t, nil, "--gc-percent", bad)
		require.ErrorContains(t, err, "gc-percent")
	}
}

// ApplyGC sets the target and a soft memory limit, unless the environment
// already chose them. Not parallel: it changes the process's collector.
func TestApplyGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))

	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	debug.SetMemoryLimit(math.MaxInt64)
	want := budget.MemoryLimit() / 2
	gc, limit := ApplyGC(321)
	require.Equal(t, 321, gc)
	require.Equal(t, 321, debug.SetGCPercent(321), "target not in force")
	require.Equal(t, want, limit)
	require.Equal(t, limit, debug.SetMemoryLimit(-1))

	// Set in the environment: left as the runtime read it.
	t.Setenv("GOGC", "100")
	t.Setenv("GOMEMLIMIT", "1GiB")
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(1 << 30)
	gc, limit = ApplyGC(321)
	require.Equal(t, 100, gc)
	require.Equal(t, int64(1<<30), limit)
}
