package firehose_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
)

func TestPrunerDeletesOnlyOldEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, options{noSequencer: true, hub: firehose.Config{PollInterval: time.Hour}})
	did := b.newRepo(t)
	for i := range 24 {
		b.write(t, did, fmt.Sprint("post ", i))
	}
	b.sequenceAll(t)
	all := b.allEvents(t)
	require.Len(t, all, 25)
	_, err := b.pool.Exec(context.Background(),
		"UPDATE events SET created_at = now() - interval '100 hours' WHERE seq <= $1", all[19].Seq)
	require.NoError(t, err)
	// One event is not yet sequenced: never pruned, whatever its age.
	b.write(t, did, "pending")
	_, err = b.pool.Exec(context.Background(), "UPDATE events SET created_at = now() - interval '100 hours' WHERE seq IS NULL")
	require.NoError(t, err)

	p := eventlog.NewPruner(b.pool, eventlog.PrunerConfig{BatchSize: 7, Logger: quietLogger})
	n, err := p.Prune(context.Background(), time.Now())
	require.NoError(t, err)
	require.Equal(t, int64(20), n)
	left := b.allEvents(t)
	require.Len(t, left, 5)
	require.Equal(t, all[20].Seq, left[0].Seq)
	require.Equal(t, int64(6), b.eventCount(t))

	// A cursor whose event was pruned is outdated: #info, then the window.
	conn := dial(t, b.wsURL, ptr(all[5].Seq))
	f, err := readFrame(t, conn)
	require.NoError(t, err)
	require.Equal(t, "#info", f.kind)
	require.Equal(t, firehose.InfoOutdatedCursor, f.info.Name)
	requireSeqs(t, left, readUntil(t, conn, left[len(left)-1].Seq))
}
