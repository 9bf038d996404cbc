package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/alert"
	"github.com/bulwark-pds/bulwark/eventlog"
	"github.com/bulwark-pds/bulwark/firehose"
)

// A stuck firehose consumer becomes a consumer_stuck alert naming the
// event and the repair command.
func TestConsumerStuckAlert(t *testing.T) {
	t.Parallel()
	got := make(chan alert.Alert, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a alert.Alert
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&a); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got <- a
	}))
	t.Cleanup(srv.Close)
	hook, err := alert.New(alert.Config{URL: srv.URL, Host: "pds.example.com"})
	require.NoError(t, err)
	consumerStuckAlert(hook)(firehose.ConsumerReport{
		IP: "192.0.2.9", UserAgent: "indigo-relay (atproto-relay)",
		Stuck: &firehose.StuckInfo{Cursor: 41, Seq: 42, Reconnects: 3, Event: &eventlog.EventInfo{
			Seq: 42, Kind: eventlog.KindCommit, FrameBytes: 5_100_000, Problems: []string{"frame is 5100000 bytes; relays drop the connection above 5000000"},
		}},
	})
	require.Equal(t, 1, hook.Deliver(context.Background()))
	a := <-got
	require.Equal(t, alert.KindConsumerStuck, a.Kind)
	require.Equal(t, alert.SeverityCritical, a.Severity)
	require.Equal(t, "192.0.2.9 indigo-relay (atproto-relay)", a.Subject)
	require.Contains(t, a.Summary, "cannot get past seq 42 (#commit, 5100000 bytes; frame is 5100000 bytes")
	require.Contains(t, a.Summary, "bulwark admin firehose rewrite-as-sync --seq 42")
	require.Equal(t, "firehose-stuck:seq:42", a.Incident)
}
