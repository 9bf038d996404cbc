package console

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
	"github.com/bulwark-pds/bulwark/relaywatch"
)

// eventAtScan bounds the events EventAt looks through past invalidated
// ones.
const eventAtScan = 100

// WatchSources are the relay watch's readers of the event log: Head reads
// the sequencer's high-water mark and nothing else (one row); EventAt, run
// only when a relay enters behind or stuck, describes the first event
// still served at or after a seq from its sizes (never its blocks).
func WatchSources(l *eventlog.Log) (relaywatch.HeadFunc, relaywatch.EventFunc) {
	head := func(ctx context.Context) (int64, time.Time, error) {
		seq, err := l.LastSeq(ctx)
		return seq, time.Time{}, err
	}
	at := func(ctx context.Context, seq int64) (relaywatch.EventInfo, error) {
		evs, err := l.Inspect(ctx, eventlog.EventFilter{FromSeq: seq, Limit: eventAtScan})
		if err != nil {
			return relaywatch.EventInfo{}, err
		}
		for _, e := range evs {
			if e.Invalidated {
				continue
			}
			return relaywatch.EventInfo{
				Seq: e.Seq, Kind: string(e.Kind), DID: e.DID, Size: e.FrameBytes,
				BrokenLimit: strings.Join(e.Problems, "; "),
			}, nil
		}
		return relaywatch.EventInfo{}, eventlog.ErrNoEvent
	}
	return head, at
}

// maxAhead bounds the consumers refused with FutureCursor the overview
// lists: a client can make up as many as it has addresses and agents.
const maxAhead = 20

// aheadConsumers picks the consumers refused with FutureCursor, at most
// maxAhead: those refused most often first (a relay or an app view retries
// all the time; a made-up one tried once), then the highest cursor.
func aheadConsumers(all []firehose.ConsumerReport) []firehose.ConsumerReport {
	var out []firehose.ConsumerReport
	for _, c := range all {
		if c.FutureCursor != nil {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b firehose.ConsumerReport) int {
		if c := cmp.Compare(b.FutureCursor.Refusals, a.FutureCursor.Refusals); c != 0 {
			return c
		}
		return cmp.Compare(b.FutureCursor.Cursor, a.FutureCursor.Cursor)
	})
	return out[:min(len(out), maxAhead)]
}
