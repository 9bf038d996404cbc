package plc_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"

	"github.com/bulwark-pds/bulwark/plc"
	"github.com/bulwark-pds/bulwark/plc/plctest"
)

// TestSignUpdateHandsOverTheDID: the server signs an operation that gives
// the DID to another server (its key, endpoint and rotation key), another
// client submits it, and from then on the first server controls nothing.
func TestSignUpdateHandsOverTheDID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, srv := plctest.NewServer(t)
	a, err := plc.NewClient(srv.URL, newKey(t), nil)
	require.NoError(t, err)
	b, err := plc.NewClient(srv.URL, newKey(t), nil)
	require.NoError(t, err)
	pub, err := newKey(t).PublicKey()
	require.NoError(t, err)
	did, op, err := a.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://a.test"})
	require.NoError(t, err)
	require.NoError(t, a.Submit(ctx, did, op))

	movedKey, err := newKey(t).PublicKey()
	require.NoError(t, err)
	next, err := a.SignUpdate(ctx, did, plc.Overrides{
		RotationKeys:        []string{b.RotationKey()},
		VerificationMethods: map[string]string{plc.VerificationMethod: movedKey.DIDKey()},
		Services:            map[string]didplc.OpService{plc.ServiceID: {Type: plc.ServiceType, Endpoint: "http://b.test"}},
	})
	require.NoError(t, err)
	require.Equal(t, []string{"at://alice.test"}, next.AlsoKnownAs, "fields not overridden are kept")
	require.Len(t, dir.Log(did.String()), 1, "signing sends nothing")
	require.True(t, b.Controls(next))
	require.False(t, a.Controls(next))

	require.NoError(t, b.Submit(ctx, did, next))
	last, _, err := b.Last(ctx, did)
	require.NoError(t, err)
	require.Equal(t, "http://b.test", last.Services[plc.ServiceID].Endpoint)
	_, err = a.SignUpdate(ctx, did, plc.Overrides{})
	require.ErrorIs(t, err, plc.ErrNotControlled)

	// Replaying a's operation: the directory rejects it (4xx).
	err = b.Submit(ctx, did, next)
	require.ErrorIs(t, err, plc.ErrRejected)
	require.ErrorIs(t, err, plc.ErrDirectory)

	// Overrides that make a malformed operation are refused before signing.
	_, err = b.SignUpdate(ctx, did, plc.Overrides{RotationKeys: []string{}})
	require.ErrorIs(t, err, plc.ErrInvalidOperation)

	// After a tombstone there is nothing left to update.
	did2, op2, err := a.Genesis(plc.Identity{Handle: "bob.test", SigningKey: pub, PDSEndpoint: "http://a.test"})
	require.NoError(t, err)
	require.NoError(t, a.Submit(ctx, did2, op2))
	require.NoError(t, a.Tombstone(ctx, did2, op2))
	_, _, err = a.Last(ctx, did2)
	require.ErrorIs(t, err, plc.ErrTombstoned)
	_, err = a.SignUpdate(ctx, did2, plc.Overrides{})
	require.ErrorIs(t, err, plc.ErrNotControlled)
}

func TestDirectoryFailureIsNotARejection(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"message":"down for maintenance"}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	c, err := plc.NewClient(srv.URL, newKey(t), nil)
	require.NoError(t, err)
	pub, err := newKey(t).PublicKey()
	require.NoError(t, err)
	did, op, err := c.Genesis(plc.Identity{Handle: "alice.test", SigningKey: pub, PDSEndpoint: "http://a.test"})
	require.NoError(t, err)
	err = c.Submit(context.Background(), did, op)
	require.ErrorIs(t, err, plc.ErrDirectory)
	require.NotErrorIs(t, err, plc.ErrRejected)
	require.Contains(t, err.Error(), "down for maintenance")
}

func TestCheckOperation(t *testing.T) {
	t.Parallel()
	key := newKey(t)
	pub, err := key.PublicKey()
	require.NoError(t, err)
	prev := "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
	good := func() *didplc.RegularOp {
		op := &didplc.RegularOp{
			Type: "plc_operation", RotationKeys: []string{pub.DIDKey()},
			VerificationMethods: map[string]string{"atproto": pub.DIDKey()},
			AlsoKnownAs:         []string{"at://alice.test"},
			Services:            map[string]didplc.OpService{"atproto_pds": {Type: plc.ServiceType, Endpoint: "https://pds.example.com"}},
			Prev:                &prev,
		}
		require.NoError(t, op.Sign(key))
		return op
	}
	require.NoError(t, plc.CheckOperation(good()))
	for name, change := range map[string]func(*didplc.RegularOp){
		"tombstone type":       func(op *didplc.RegularOp) { op.Type = "plc_tombstone" },
		"no prev":              func(op *didplc.RegularOp) { op.Prev = nil },
		"unsigned":             func(op *didplc.RegularOp) { op.Sig = nil },
		"no rotation keys":     func(op *didplc.RegularOp) { op.RotationKeys = nil },
		"six rotation keys":    func(op *didplc.RegularOp) { op.RotationKeys = []string{"a", "b", "c", "d", "e", "f"} },
		"duplicate key":        func(op *didplc.RegularOp) { op.RotationKeys = []string{pub.DIDKey(), pub.DIDKey()} },
		"not a did:key":        func(op *didplc.RegularOp) { op.RotationKeys = []string{"did:web:example.com"} },
		"bad method":           func(op *didplc.RegularOp) { op.VerificationMethods["atproto"] = "zQ3sh" },
		"service w/o endpoint": func(op *didplc.RegularOp) { op.Services["atproto_pds"] = didplc.OpService{Type: plc.ServiceType} },
		"long alias": func(op *didplc.RegularOp) {
			op.AlsoKnownAs = []string{"at://" + strings.Repeat("a", plc.MaxFieldLength)}
		},
	} {
		op := good()
		change(op)
		require.ErrorIs(t, plc.CheckOperation(op), plc.ErrInvalidOperation, name)
	}
}
