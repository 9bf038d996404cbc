package procstat

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	// A command name with a space and a parenthesis, as proc(5) allows.
	line := "1234 (a b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 5 1 0 100 1000 10"
	s, err := Parse([]byte(line))
	require.NoError(t, err)
	require.Equal(t, "1", s.PPID())
	cpu, err := s.CPU()
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, cpu) // (250 + 50) ticks of 10 ms
	n, err := s.Nice()
	require.NoError(t, err)
	require.Equal(t, 5, n)

	_, err = Parse([]byte("1234 no parenthesis"))
	require.Error(t, err)
	_, err = Parse([]byte("1234 (x) S 1 2"))
	require.Error(t, err)
}

func TestReadSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	s, err := Read("/proc/self/stat")
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(os.Getppid()), s.PPID())
	_, err = s.CPU()
	require.NoError(t, err)
}
