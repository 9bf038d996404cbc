package firehose

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSubscriberQueueBound: a subscriber whose queue would overflow is
// marked too slow and lets go of what it held.
func TestSubscriberQueueBound(t *testing.T) {
	t.Parallel()
	s := &liveQueue{signal: make(chan struct{}, 1)}
	f := func(seq int64) liveFrame { return liveFrame{seq: seq, data: make([]byte, 10)} }
	require.True(t, s.push([]liveFrame{f(1), f(2)}, 3, 1000))
	q, slow := s.take(nil)
	require.False(t, slow)
	require.Len(t, q, 2)
	require.True(t, s.push([]liveFrame{f(3), f(4), f(5)}, 3, 1000))
	require.False(t, s.push([]liveFrame{f(6)}, 3, 1000))
	q, slow = s.take(q)
	require.True(t, slow)
	require.Empty(t, q)
	require.False(t, s.push([]liveFrame{f(7)}, 3, 1000), "once too slow, always too slow")
	// The byte bound counts too.
	s2 := &liveQueue{signal: make(chan struct{}, 1)}
	require.False(t, s2.push([]liveFrame{f(1), f(2)}, 100, 15))
}

func TestErrorAndInfoFrames(t *testing.T) {
	t.Parallel()
	// {op: -1} then {error: "FutureCursor", message: "m"}: bytes checked by
	// hand against the DAG-CBOR spec.
	got := errorFrame("FutureCursor", "m")
	want := []byte{0xa1, 0x62, 'o', 'p', 0x20,
		0xa2, 0x65, 'e', 'r', 'r', 'o', 'r', 0x6c, 'F', 'u', 't', 'u', 'r', 'e', 'C', 'u', 'r', 's', 'o', 'r',
		0x67, 'm', 'e', 's', 's', 'a', 'g', 'e', 0x61, 'm'}
	require.Equal(t, want, got)
	require.Contains(t, string(infoFrame("OutdatedCursor", "x")), "#info")
}
