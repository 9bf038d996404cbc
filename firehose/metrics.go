package firehose

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/metrics"
)

// The firehose's series in package metrics, with their label values
// resolved once: looking a label up per frame would hash it on every
// frame of every subscriber.

// Frame kinds beside the event kinds, as frames_sent_total labels them.
const (
	frameKindInfo  = "info"
	frameKindError = "error"
)

var frameCounters = func() map[string]prometheus.Counter {
	m := map[string]prometheus.Counter{}
	for _, k := range []string{
		string(eventlog.KindCommit), string(eventlog.KindSync), string(eventlog.KindIdentity),
		string(eventlog.KindAccount), frameKindInfo, frameKindError,
	} {
		m[k] = metrics.FirehoseFrames.WithLabelValues(k)
	}
	return m
}()

// frameTally counts frames by kind and their bytes, so that a batch of
// live frames costs one counter update per kind, not one per frame.
type frameTally struct {
	kinds [8]string
	n     [8]int
	used  int
	bytes int
}

func (t *frameTally) add(kind string, size int) {
	t.bytes += size
	for i := range t.used {
		if t.kinds[i] == kind {
			t.n[i]++
			return
		}
	}
	if t.used < len(t.kinds) {
		t.kinds[t.used], t.n[t.used] = kind, 1
		t.used++
	}
}

// flush records the tally in the metrics and empties it.
func (t *frameTally) flush() {
	for i := range t.used {
		if c, ok := frameCounters[t.kinds[i]]; ok {
			c.Add(float64(t.n[i]))
		}
	}
	if t.bytes > 0 {
		metrics.FirehoseBytes.Add(float64(t.bytes))
	}
	*t = frameTally{}
}

// countFrame records one frame sent.
func countFrame(kind string, size int) {
	if c, ok := frameCounters[kind]; ok {
		c.Inc()
	}
	metrics.FirehoseBytes.Add(float64(size))
}

// Refusal reasons, the upgrades_refused_total labels.
const (
	RefusedRateLimited       = "rate_limited"
	RefusedTooManyFromClient = "too_many_from_client"
	RefusedServerFull        = "server_full"
)

var (
	refusedRateLimited  = metrics.FirehoseRefused.WithLabelValues(RefusedRateLimited)
	refusedPerClient    = metrics.FirehoseRefused.WithLabelValues(RefusedTooManyFromClient)
	refusedServerFull   = metrics.FirehoseRefused.WithLabelValues(RefusedServerFull)
	disconnectsByReason = func() map[EndReason]prometheus.Counter {
		m := map[EndReason]prometheus.Counter{}
		for r, label := range disconnectLabels {
			m[r] = metrics.FirehoseDisconnects.WithLabelValues(label)
		}
		return m
	}()
)

// disconnectLabels are the disconnects_total labels of each EndReason.
var disconnectLabels = map[EndReason]string{
	EndClientClosed:   "client_closed",
	EndReadError:      "read_timeout",
	EndWriteError:     "write_error",
	EndWriteTimeout:   "write_timeout",
	EndConsumerSlow:   "consumer_too_slow",
	EndFutureCursor:   "future_cursor",
	EndServerShutdown: "shutdown",
	EndRateLimited:    "rate_limited",
	EndOther:          "other",
}

// countDisconnect records a subscription that ended for r.
func countDisconnect(r EndReason) {
	c, ok := disconnectsByReason[r]
	if !ok {
		c = disconnectsByReason[EndOther]
	}
	c.Inc()
}
