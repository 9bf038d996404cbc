package alert_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/alert"
)

// A storm fires once when refusals reach the threshold within a window,
// stays one storm while they keep coming, ends after a quiet window, and
// the next one fires again.
func TestStormFiresOncePerStorm(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	var storms []alert.Storm
	d := alert.NewStormDetector(alert.StormConfig{
		Threshold: 5, Window: time.Minute,
		Now:     func() time.Time { return now },
		OnStorm: func(s alert.Storm) { storms = append(storms, s) },
	})
	for range 4 {
		require.False(t, d.Record())
	}
	require.False(t, d.Active())
	require.True(t, d.Record())
	require.True(t, d.Active())
	require.Equal(t, []alert.Storm{{Start: now, Refusals: 5, Threshold: 5, WindowSeconds: 60}}, storms)

	// The storm goes on into the next windows: no second alert.
	for range 3 {
		now = now.Add(time.Minute)
		for range 10 {
			require.False(t, d.Record())
		}
	}
	require.Len(t, storms, 1)

	// A quiet window ends it.
	now = now.Add(2 * time.Minute)
	require.False(t, d.Active())
	for range 4 {
		require.False(t, d.Record())
	}
	require.True(t, d.Record())
	require.Len(t, storms, 2)
	require.Equal(t, int64(2), d.Storms())
}

// Refusals straddling a window boundary count together.
func TestStormSlidingWindow(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 0, 0, 0, time.UTC)
	d := alert.NewStormDetector(alert.StormConfig{Threshold: 10, Now: func() time.Time { return now }})
	d.Record() // starts the first window at :00
	now = now.Add(50 * time.Second)
	for range 7 {
		require.False(t, d.Record())
	}
	// At :70 the first window (8 refusals) still weighs 8*50/60 = 6.
	now = now.Add(20 * time.Second)
	for range 3 {
		require.False(t, d.Record())
	}
	require.True(t, d.Record())

	// A trickle under the threshold never fires.
	slow := alert.NewStormDetector(alert.StormConfig{Threshold: 10, Now: func() time.Time { return now }})
	for range 60 {
		now = now.Add(10 * time.Second)
		require.False(t, slow.Record())
	}
	require.Zero(t, slow.Storms())
}
