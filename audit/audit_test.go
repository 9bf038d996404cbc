package audit_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/audit"
	"github.com/bulwark-pds/bulwark/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// Entries keep their states before and after, list newest first per
// subject, and page by id.
func TestRecordAndList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	for i, e := range []*audit.Entry{
		{Actor: "admin", Action: "a.first", Subject: "did:plc:one", After: map[string]any{"n": 1}},
		{Actor: "console", Action: "a.second", Subject: "did:plc:one", Before: map[string]any{"n": 1}, After: map[string]any{"n": 2}, Reason: "why"},
		{Actor: "admin", Action: "a.other", Subject: "did:plc:two"},
	} {
		require.NoError(t, audit.Record(ctx, pool, e), i)
		require.NotZero(t, e.ID)
		require.False(t, e.At.IsZero())
	}
	all, err := audit.List(ctx, pool, "", 0, 10)
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.Equal(t, "a.other", all[0].Action)
	require.Nil(t, all[0].Before)
	require.Nil(t, all[0].After)

	one, err := audit.List(ctx, pool, "did:plc:one", 0, 1)
	require.NoError(t, err)
	require.Len(t, one, 1)
	require.Equal(t, "a.second", one[0].Action)
	require.Equal(t, "why", one[0].Reason)
	require.JSONEq(t, `{"n":1}`, string(one[0].Before.(json.RawMessage)))
	require.JSONEq(t, `{"n":2}`, string(one[0].After.(json.RawMessage)))
	older, err := audit.List(ctx, pool, "did:plc:one", one[0].ID, 10)
	require.NoError(t, err)
	require.Len(t, older, 1)
	require.Equal(t, "a.first", older[0].Action)

	require.Error(t, audit.Record(ctx, pool, &audit.Entry{Actor: "admin", Action: "x", Subject: "y", After: func() {}}), "a state that is not JSON")
}
