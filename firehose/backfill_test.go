package firehose_test

import (
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/firehose"
)

// A backfill reads every page into the same memory: it allocates a small
// fraction of the bytes it sends. Were each event's body copied out of the
// database afresh (as a page of events read with pgx.CollectRows is), a
// replay would allocate more than it sends, and under the server's GOGC=400
// the process would grow by several times its live heap during any long
// replay.
func TestBackfillAllocatesLittlePerEvent(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops what is put back: allocation counts mean nothing")
	}
	t.Parallel()
	const n = 20_000
	fb := setup(t, options{hub: firehose.Config{Logger: quietLogger}})
	last := fillLog(t, fb, n)
	// The hub reads the new events for its live subscribers too: let it
	// be done before counting.
	require.Eventually(t, func() bool { return fb.hub.Delivered() >= last }, 30*time.Second, time.Millisecond)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	conn, _, err := websocket.DefaultDialer.Dial(fb.wsURL+"?cursor=0", nil)
	require.NoError(t, err)
	defer conn.Close()
	buf := make([]byte, 64<<10)
	got, sent := 0, 0
	for {
		_, r, err := conn.NextReader()
		require.NoError(t, err)
		k, err := io.ReadFull(r, buf)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "frames are smaller than the buffer")
		got++
		sent += k
		if seqOf(buf[:k]) >= last {
			break
		}
	}
	runtime.ReadMemStats(&ms)
	perEvent := float64(ms.TotalAlloc-before) / float64(got)
	t.Logf("%d events, %d bytes per frame, %.0f bytes allocated per event (server and reader)", got, sent/got, perEvent)
	require.GreaterOrEqual(t, got, n)
	require.Less(t, perEvent, float64(sent/got)/3, "a backfill allocates a fraction of what it sends")
}
