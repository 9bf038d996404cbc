package pds

import (
	"context"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/alert"
	"github.com/bulwark-pds/bulwark/budget"
	"github.com/bulwark-pds/bulwark/config"
)

// Each 503 ServiceOverloaded (a full in-flight budget) reaches OnOverload,
// where serve feeds the storm detector; other refusals and errors do not.
func TestOverloadFeedsStormDetector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := budget.New(budget.Config{Capacity: 4 << 20, MaxQueue: -1})
	var calls atomic.Int64
	var storms atomic.Int64
	storm := alert.NewStormDetector(alert.StormConfig{Threshold: 3, OnStorm: func(alert.Storm) { storms.Add(1) }})
	e := newAccountEnv(t, envOptions{
		configure: func(c *config.Config) { c.RefusalCoolOff = 0 },
		options: func(o *Options) {
			o.Budget = b
			o.ExportSlots = -1
			o.OnOverload = func() { calls.Add(1); storm.Record() }
		},
	})
	u := e.createUser(t)
	hold, err := b.Acquire(ctx, 4<<20)
	require.NoError(t, err)
	defer hold.Release()

	q := url.Values{"did": {u.did.String()}}
	for range 5 {
		e.get(t, "com.atproto.sync.getRepo", "", q).fails(t, http.StatusServiceUnavailable, "ServiceOverloaded")
	}
	e.get(t, "com.atproto.sync.getRepo", "", url.Values{"did": {"did:plc:nobodynobodynobody00000"}}).fails(t, http.StatusServiceUnavailable, "ServiceOverloaded")
	e.get(t, "com.atproto.sync.getLatestCommit", "", url.Values{"did": {"not a did"}}).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Equal(t, int64(6), calls.Load())
	require.Equal(t, int64(1), storms.Load(), "one storm, alerted once")
}
