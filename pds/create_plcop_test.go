package pds

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	didplc "github.com/did-method-plc/go-didplc"
	"github.com/stretchr/testify/require"
)

// holderOp is a PLC operation the holder of rotation key rot signs for e:
// rot and e's rotation key as rotation keys, signingKey as atproto, handle
// first in alsoKnownAs, e's URL as atproto_pds, after prev ("" for a
// genesis); change alters it before it is signed.
func holderOp(t *testing.T, e *accountEnv, rot atcrypto.PrivateKey, signingKey, handle, prev string, change func(*didplc.RegularOp)) *didplc.RegularOp {
	t.Helper()
	pub, err := rot.PublicKey()
	require.NoError(t, err)
	op := &didplc.RegularOp{
		Type:                "plc_operation",
		RotationKeys:        []string{pub.DIDKey(), e.accounts.RotationKey()},
		VerificationMethods: map[string]string{"atproto": signingKey},
		AlsoKnownAs:         []string{"at://" + handle},
		Services:            map[string]didplc.OpService{"atproto_pds": {Type: "AtprotoPersonalDataServer", Endpoint: e.cfg.PublicURL()}},
	}
	if prev != "" {
		op.Prev = &prev
	}
	if change != nil {
		change(op)
	}
	require.NoError(t, op.Sign(rot))
	return op
}

// reserved is the key e's reserveSigningKey promises did.
func (e *accountEnv) reserved(t *testing.T, did string) string {
	t.Helper()
	return e.post(t, "com.atproto.server.reserveSigningKey", "", map[string]any{"did": did}).ok(t).str(t, "signingKey")
}

func opJSON(t *testing.T, op *didplc.RegularOp) map[string]any {
	t.Helper()
	b, err := json.Marshal(op)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// TestCreateAccountWithGenesisOp: a genesis operation the holder signed
// with a rotation key of their own (its atproto key the one
// reserveSigningKey reserved for that rotation key) makes an active
// account of the DID it computes, submitted to the directory as signed.
// An operation that drops the server's rotation key, points elsewhere,
// names another key or handle, is signed by a key not among its rotation
// keys, or makes another DID than the one asked is 400 IncompatibleDidDoc
// (the reference PDS's name) and stores and submits nothing.
func TestCreateAccountWithGenesisOp(t *testing.T) {
	t.Parallel()
	e := newAccountEnv(t, envOptions{})
	rot, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	rotPub, err := rot.PublicKey()
	require.NoError(t, err)
	key := e.reserved(t, rotPub.DIDKey())
	stranger, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	in := func(op *didplc.RegularOp) map[string]any {
		return map[string]any{"handle": "holder.test", "email": "holder@example.com", "password": "holder password", "plcOp": opJSON(t, op)}
	}
	before, dids := e.rowCounts(t), e.plc.Count()

	refused := map[string]*didplc.RegularOp{
		"drops the server's rotation key": holderOp(t, e, rot, key, "holder.test", "", func(op *didplc.RegularOp) { op.RotationKeys = op.RotationKeys[:1] }),
		"points elsewhere": holderOp(t, e, rot, key, "holder.test", "", func(op *didplc.RegularOp) {
			op.Services["atproto_pds"] = didplc.OpService{Type: "AtprotoPersonalDataServer", Endpoint: "https://evil.example.com"}
		}),
		"another signing key": holderOp(t, e, rot, rotPub.DIDKey(), "holder.test", "", nil),
		"another handle":      holderOp(t, e, rot, key, "other.test", "", nil),
		"signed by a stranger": func() *didplc.RegularOp {
			op := holderOp(t, e, rot, key, "holder.test", "", nil)
			require.NoError(t, op.Sign(stranger))
			return op
		}(),
	}
	for name, op := range refused {
		msg := e.post(t, "com.atproto.server.createAccount", "", in(op)).fails(t, http.StatusBadRequest, "IncompatibleDidDoc")
		require.NotEmpty(t, msg, name)
	}
	good := holderOp(t, e, rot, key, "holder.test", "", nil)
	wrongDID := in(good)
	wrongDID["did"] = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	e.post(t, "com.atproto.server.createAccount", "", wrongDID).fails(t, http.StatusBadRequest, "IncompatibleDidDoc")
	tomb := in(good)
	tomb["plcOp"] = map[string]any{"type": "plc_tombstone", "prev": "x", "sig": "y"}
	e.post(t, "com.atproto.server.createAccount", "", tomb).fails(t, http.StatusBadRequest, "IncompatibleDidDoc")
	require.Equal(t, before, e.rowCounts(t), "nothing stored")
	require.Equal(t, dids, e.plc.Count(), "nothing submitted")

	res := e.post(t, "com.atproto.server.createAccount", "", in(good)).ok(t)
	want, err := good.DID()
	require.NoError(t, err)
	require.Equal(t, want, res.str(t, "did"))
	log := e.plc.Log(want)
	require.Len(t, log, 1)
	require.Equal(t, good.CID().String(), log[0].CID, "the holder's operation, as signed")
	require.Equal(t, []string{"identity", "account", "sync"}, e.eventKinds(t, syntax.DID(want)))
	access := res.str(t, "accessJwt")
	require.Equal(t, true, e.get(t, "com.atproto.server.getSession", access, nil).ok(t).json(t)["active"])
	e.post(t, "com.atproto.repo.createRecord", access, map[string]any{
		"repo": want, "collection": "app.bsky.feed.post", "record": post("signed with my own genesis"),
	}).ok(t)
	st := e.get(t, "com.atproto.server.checkAccountStatus", access, nil).ok(t).json(t)
	require.Equal(t, true, st["validDid"])

	// The same operation again: the DID has its account.
	e.post(t, "com.atproto.server.createAccount", "", in(good)).fails(t, http.StatusBadRequest, "InvalidRequest")
	require.Len(t, e.plc.Log(want), 1)
}

// TestCreateAccountWithUpdateOp: the holder of a rotation key of an
// existing did:plc (its recoveryKey) moves it to b without the old
// server: an update operation they sign, following the DID's current
// one, with b's reserved key and URL. b submits it and creates the
// account deactivated, for the repository to be imported, then
// activated. An operation that does not follow the current one (one
// already applied, replayed) or is signed by a key that is not a current
// rotation key is refused, as is one without the did it updates.
func TestCreateAccountWithUpdateOp(t *testing.T) {
	t.Parallel()
	p := newMigrationPair(t, envOptions{})
	rot, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	rotPub, err := rot.PublicKey()
	require.NoError(t, err)
	res := p.a.post(t, "com.atproto.server.createAccount", "", map[string]any{
		"handle": "leaver.test", "email": "leaver@example.com", "password": "leaver password", "recoveryKey": rotPub.DIDKey(),
	}).ok(t)
	did := res.str(t, "did")
	p.a.post(t, "com.atproto.repo.createRecord", res.str(t, "accessJwt"), map[string]any{
		"repo": did, "collection": "app.bsky.feed.post", "record": post("before the move"),
	}).ok(t)
	car := p.a.get(t, "com.atproto.sync.getRepo", "", map[string][]string{"did": {did}}).ok(t).body
	head := func() string { l := p.plc.Log(did); return l[len(l)-1].CID }
	key := p.b.reserved(t, did)
	in := func(op *didplc.RegularOp) map[string]any {
		return map[string]any{"did": did, "handle": "arrived.test", "email": "arrived@example.com", "password": "arrived password", "plcOp": opJSON(t, op)}
	}
	stranger, err := atcrypto.GeneratePrivateKeyK256()
	require.NoError(t, err)
	before := p.b.rowCounts(t)
	p.b.post(t, "com.atproto.server.createAccount", "", in(holderOp(t, p.b, stranger, key, "arrived.test", head(), nil))).fails(t, http.StatusBadRequest, "IncompatibleDidDoc")
	stale := holderOp(t, p.b, rot, key, "arrived.test", p.plc.Log(did)[0].CID, nil)
	noDID := in(holderOp(t, p.b, rot, key, "arrived.test", head(), nil))
	delete(noDID, "did")
	p.b.post(t, "com.atproto.server.createAccount", "", noDID).fails(t, http.StatusBadRequest, "IncompatibleDidDoc")
	require.Equal(t, before, p.b.rowCounts(t))

	op := holderOp(t, p.b, rot, key, "arrived.test", head(), nil)
	created := p.b.post(t, "com.atproto.server.createAccount", "", in(op)).ok(t)
	require.Equal(t, op.CID().String(), head(), "b submitted the holder's operation")
	access := created.str(t, "accessJwt")
	require.Equal(t, "deactivated", p.b.get(t, "com.atproto.server.getSession", access, nil).ok(t).json(t)["status"])
	require.Empty(t, p.b.eventKinds(t, syntax.DID(did)), "announced when activated")

	// Replays: the operation just applied, and one that follows an older
	// operation.
	p.b.post(t, "com.atproto.server.createAccount", "", in(op)).fails(t, http.StatusBadRequest, "IncompatibleDidDoc")
	p.b.post(t, "com.atproto.server.createAccount", "", in(stale)).fails(t, http.StatusBadRequest, "IncompatibleDidDoc")

	p.b.do(t, http.MethodPost, "com.atproto.repo.importRepo", access, bytes.NewReader(car), nil, http.Header{"Content-Type": {"application/vnd.ipld.car"}}).ok(t)
	p.b.post(t, "com.atproto.server.activateAccount", access, nil).ok(t)
	require.Equal(t, true, p.b.get(t, "com.atproto.server.getSession", access, nil).ok(t).json(t)["active"])
	list := p.b.get(t, "com.atproto.repo.listRecords", "", map[string][]string{"repo": {did}, "collection": {"app.bsky.feed.post"}}).ok(t).json(t)
	require.Len(t, list["records"], 1)
}
