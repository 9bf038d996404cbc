package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackgroundMaxPause(t *testing.T) {
	t.Parallel()
	c, err := parse(t, nil)
	require.NoError(t, err)
	require.Equal(t, DefaultBackgroundMaxPause, c.BackgroundMaxPause)

	c, err = parse(t, map[string]string{"BULWARK_BACKGROUND_MAX_PAUSE": "40ms"})
	require.NoError(t, err)
	require.Equal(t, 40*time.Millisecond, c.BackgroundMaxPause)

	c, err = parse(t, nil, "--background-max-pause", "0")
	require.NoError(t, err)
	require.Zero(t, c.BackgroundMaxPause, "0 turns pausing off")

	for _, bad := range []string{"-1ms", "2s"} {
		_, err = parse(t, nil, "--background-max-pause", bad)
		require.ErrorContains(t, err, "background-max-pause")
	}
}
